import fs from 'node:fs';
import { expect } from 'chai';
import { Validator } from '@seriousme/openapi-schema-validator';
import { startTestServer, type TestServer } from '../support/server.ts';
import { openApiPath } from '../../src/http/openapi/document.ts';

type Layer = { route?: { path: string | string[]; methods: Record<string, boolean> }; handle?: { stack?: Layer[] } };

/** Every (method, path) the express application routes, read from its router's own layers. */
function expressRoutes(stack: Layer[]): string[] {
  const out: string[] = [];
  for (const layer of stack) {
    if (layer.route) {
      const paths = Array.isArray(layer.route.path) ? layer.route.path : [layer.route.path];
      for (const method of Object.keys(layer.route.methods)) for (const p of paths) out.push(`${method.toUpperCase()} ${openApiPath(p)}`);
    } else if (layer.handle?.stack) {
      out.push(...expressRoutes(layer.handle.stack));
    }
  }
  return out;
}

function documentRoutes(doc: { paths: Record<string, Record<string, unknown>> }): string[] {
  return Object.entries(doc.paths).flatMap(([p, ops]) => Object.keys(ops).map((m) => `${m.toUpperCase()} ${p}`));
}

describe('OpenAPI document', () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
  });

  it('is served at /openapi.json and names exactly the routes the application serves', async () => {
    const res = await fetch(`${server.url}/openapi.json`);
    expect(res.status).to.equal(200);
    const doc = (await res.json()) as { openapi: string; paths: Record<string, Record<string, unknown>> };
    expect(doc.openapi).to.equal('3.1.0');
    const routed = expressRoutes((server.app as unknown as { router: { stack: Layer[] } }).router.stack).sort();
    expect(routed.length).to.be.greaterThan(30);
    expect(documentRoutes(doc).sort()).to.deep.equal([...new Set(routed)].sort());
  });

  it('validates as OpenAPI 3.1, and the copy in the repository is current', async () => {
    const served = await (await fetch(`${server.url}/openapi.json`)).json();
    const result = await new Validator().validate(served as Parameters<Validator["validate"]>[0]);
    expect(result.errors ?? [], JSON.stringify(result.errors)).to.deep.equal([]);
    expect(result.valid).to.equal(true);
    const committed = JSON.parse(fs.readFileSync(new URL('../../openapi.json', import.meta.url), 'utf8'));
    expect(committed, 'openapi.json is stale: npm run -s sarsen -- openapi > openapi.json').to.deep.equal(served);
  });

  it('describes bodies with the zod schemas the routes validate with, and each route\'s error codes', async () => {
    const doc = (await (await fetch(`${server.url}/openapi.json`)).json()) as any;
    const create = doc.paths['/{tenancy}/v1/namespaces/{ns}/backends'].post;
    const body = create.requestBody.content['application/json'].schema;
    expect(body.required).to.include.members(['name', 'kind', 'address']);
    expect(body.properties.kind.enum).to.deep.equal(['chat_compat', 'messages', 'aggregator']);
    expect(body.additionalProperties).to.equal(false); // unknown fields are a 400
    const ref = (r: { $ref?: string }) => (r.$ref ? doc.components.responses[r.$ref.split('/').pop()!] : r);
    expect(ref(create.responses['422']).content['application/json'].schema.properties.error.properties.code.enum).to.include.members([
      'backend_host_refused',
      'passthrough_disabled',
    ]);
    const chat = doc.paths['/{tenancy}/{namespace}/v1/chat/completions'].post;
    expect(Object.keys(chat.responses)).to.include.members(['200', '401', '504', '508']);
    expect(chat.responses['200'].content).to.have.keys(['application/json', 'text/event-stream']);
  });
});
