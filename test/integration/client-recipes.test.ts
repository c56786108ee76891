// The client recipes of docs/clients.md, run as they stand (issue 31): each fenced block under a
// `<!-- recipe: NAME -->` marker is written to a file and run as a child process (node for
// TypeScript, sh for curl) against a real Sarsen and the fake provider, with the page's address
// replaced by the test's and the key in SARSEN_KEY. A recipe that stops working, goes missing or
// calls another route than it should fails here, not at a user's. (A `recipe-module` block is a
// module, driven by its own test: durable-fetch-ai-sdk.test.ts.)
import { expect } from 'chai';
import fs from 'node:fs';
import path from 'node:path';
import { execFile } from 'node:child_process';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, defaultAnswer, type FakeProvider } from '../support/fake-provider.ts';
import { provision } from '../support/tenant.ts';
import { rawRequest, json } from '../support/http.ts';
import { recipeDir } from './durable-fetch-support.ts';

const PAGE_ADDRESS = 'http://127.0.0.1:8080/acme/prod';
const DIALECT_OF_PATH: Record<string, string> = { '/v1/chat/completions': 'chat', '/v1/responses': 'responses', '/v1/messages': 'messages' };

/** The provider paths each recipe calls, in order: what its clients make of the page's setup. */
const EXPECTED: Record<string, string[]> = {
  'openai-chat': ['/v1/chat/completions', '/v1/chat/completions'],
  'openai-responses': ['/v1/responses', '/v1/responses'],
  'openai-background': ['/v1/responses', '/v1/responses'],
  'openai-batch': ['/v1/chat/completions', '/v1/chat/completions'],
  'anthropic-batch': ['/v1/messages', '/v1/messages'],
  anthropic: ['/v1/messages', '/v1/messages'],
  'ai-sdk-openai': ['/v1/responses', '/v1/responses', '/v1/chat/completions'],
  'ai-sdk-anthropic': ['/v1/messages', '/v1/messages'],
  langchain: ['/v1/chat/completions', '/v1/chat/completions', '/v1/responses'],
  curl: ['/v1/chat/completions', '/v1/responses', '/v1/responses'],
  'durable-fetch': ['/v1/chat/completions', '/v1/messages'],
  // One provider call: the stream left, then read again by id.
  'openai-resume-by-id': ['/v1/chat/completions'],
};

type Recipe = { name: string; lang: string; code: string };

function readRecipes(): Recipe[] {
  const page = fs.readFileSync('docs/clients.md', 'utf8');
  return [...page.matchAll(/<!-- recipe: ([a-z0-9-]+) -->\n```(\w+)\n([\s\S]*?)\n```/g)].map((m) => ({ name: m[1]!, lang: m[2]!, code: `${m[3]!}\n` }));
}

function run(file: string, args: string[], cwd: string, env: Record<string, string>): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(file, args, { cwd, env: { ...process.env, ...env }, timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
  });
}

/** The text deltas of the SSE events in `out`, joined (what a streamed answer's text was). */
function deltas(out: string): string {
  return [...out.matchAll(/"delta":("(?:[^"\\]|\\.)*")/g)].map((m) => JSON.parse(m[1]!) as string).join('');
}

describe('client recipes (docs/clients.md)', function () {
  this.timeout(120_000);
  let server: TestServer;
  let provider: FakeProvider;
  let dir: string;
  const recipes = readRecipes();

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer();
    // The recipes import the project's devDependencies, as a user's project would its own.
    dir = recipeDir();
  });
  after(async () => {
    await server?.close();
    await provider?.close();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });
  beforeEach(() => provider.reset());

  it('the page has exactly the recipes this test runs', () => {
    expect(recipes.map((r) => r.name).sort()).to.deep.equal(Object.keys(EXPECTED).sort());
  });

  for (const name of Object.keys(EXPECTED)) {
    it(`${name}: runs unmodified, calls the routes it should, and prints the provider's answers`, async () => {
      const recipe = recipes.find((r) => r.name === name);
      expect(recipe, `recipe ${name} in docs/clients.md`).to.not.equal(undefined);
      expect(recipe!.code).to.include(PAGE_ADDRESS);
      // A namespace of its own, so no recipe's identical body attaches to another's request.
      const t = await provision(server, provider);
      const code = recipe!.code.replaceAll(PAGE_ADDRESS, `${server.url}/${t.tenancy}/${t.namespace}`);
      const file = path.join(dir, `${name}.${recipe!.lang === 'sh' ? 'sh' : 'mts'}`);
      fs.writeFileSync(file, code);
      const result = recipe!.lang === 'sh'
        ? await run('sh', ['-e', file], dir, { SARSEN_KEY: t.key })
        : await run(process.execPath, [file], dir, { SARSEN_KEY: t.key });
      const said = `exit ${result.code}\nstdout:\n${result.stdout}\nstderr:\n${result.stderr}`;
      expect(result.code, said).to.equal(0);

      expect(provider.journal.map((e) => e.path), said).to.deep.equal(EXPECTED[name]);
      // Every prompt of the recipe was answered, whole or as a stream's deltas.
      const prompts = [...recipe!.code.matchAll(/['"](Say hello[^'"]*)['"]/g)].map((m) => m[1]!);
      expect(prompts.length).to.be.at.least(1);
      for (const prompt of prompts) {
        const text = defaultAnswer({ messages: [{ role: 'user', content: prompt }] }).text;
        expect(result.stdout.includes(text) || deltas(result.stdout).includes(text), `${prompt}: ${said}`).to.equal(true);
      }
      // Sarsen recorded each call in the dialect of the route it came in on.
      const listing = json(await rawRequest(`${t.base}/requests?limit=200`, { headers: { 'x-sarsen-key': t.key } }));
      expect(listing.data.map((r: { dialect: string }) => r.dialect).sort()).to.deep.equal(EXPECTED[name]!.map((p) => DIALECT_OF_PATH[p]).sort());
      expect(listing.data.every((r: { status: string }) => r.status === 'succeeded')).to.equal(true);
    });
  }
});
