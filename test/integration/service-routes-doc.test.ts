// docs/api.md "Service routes" lists every route under /{tenancy}/{namespace}/v1: this reads the
// table and the express application's own router, and fails when either has a route the other lacks.
import fs from 'node:fs';
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { openApiPath } from '../../src/http/openapi/document.ts';

const BASE = '/{tenancy}/{namespace}/v1';

type Layer = { route?: { path: string | string[]; methods: Record<string, boolean> }; handle?: { stack?: Layer[] } };

/** Every `METHOD /path` the router serves under the service base, the base cut off. */
function serviceRoutes(stack: Layer[]): string[] {
  return stack.flatMap((layer) => {
    if (layer.handle?.stack) return serviceRoutes(layer.handle.stack);
    if (!layer.route) return [];
    const paths = (Array.isArray(layer.route.path) ? layer.route.path : [layer.route.path]).map(openApiPath);
    return Object.keys(layer.route.methods).flatMap((m) =>
      paths.filter((p) => p.startsWith(`${BASE}/`)).map((p) => `${m.toUpperCase()} ${p.slice(BASE.length)}`));
  });
}

/** The routes in the first cell of each row of the page's table (a query string cut off). */
function documentedRoutes(): string[] {
  const page = fs.readFileSync(new URL('../../docs/api.md', import.meta.url), 'utf8');
  const section = page.slice(page.indexOf('\n## Service routes\n'));
  const table = section.slice(0, section.indexOf('\n\n', section.indexOf('\n|')));
  return table.split('\n').filter((line) => line.startsWith('| `')).map((line) => {
    const m = /^\| `(GET|POST|PUT|PATCH|DELETE) (\/[^`?]*)[^`]*` \|/.exec(line);
    expect(m, `a row of docs/api.md "Service routes" that names no route: ${line}`).to.not.equal(null);
    return `${m![1]} ${m![2]}`;
  });
}

describe('docs/api.md "Service routes"', () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
  });

  it('lists exactly the routes the application serves under /{tenancy}/{namespace}/v1, each once', () => {
    const routed = serviceRoutes((server.app as unknown as { router: { stack: Layer[] } }).router.stack);
    const documented = documentedRoutes();
    expect(routed).to.include('POST /chat/completions');
    expect(documented, 'a route listed twice').to.have.length(new Set(documented).size);
    expect([...documented].sort()).to.deep.equal([...new Set(routed)].sort());
  });
});
