// The AI SDK's `useChat({ resume: true })` backed by Sarsen, with no Redis (docs/clients.md
// "Resume after a page reload or a restart"): the recipe's two routes, taken from the page as
// they stand, served over HTTP and driven by the AI SDK's DefaultChatTransport, whose
// sendMessages and reconnectToStream are what useChat calls. A page that leaves mid-answer and
// the next page that resumes get the whole message from one provider call.
import { expect } from 'chai';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { pathToFileURL } from 'node:url';
import { DefaultChatTransport, type UIMessage, type UIMessageChunk } from 'ai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { track } from '../support/resources.ts';
import { gate } from './streaming-support.ts';
import { recipeDir, docBlock } from './durable-fetch-support.ts';

const PAGE_BASE = 'http://127.0.0.1:8080/acme/prod/v1';

type Routes = {
  POST(req: Request): Promise<Response>;
  GET(req: Request, ctx: { params: Promise<{ id: string }> }): Promise<Response>;
  activeRequest: Map<string, string | null>;
};

/** The routes as an application's server would serve them. */
async function serve(routes: Routes): Promise<{ url: string; close(): Promise<void> }> {
  const server = http.createServer((req, res) => {
    void (async () => {
      const url = new URL(req.url!, 'http://127.0.0.1');
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      const headers = Object.entries(req.headers).flatMap(([k, v]) => (typeof v === 'string' ? [[k, v] as [string, string]] : []));
      const web = new Request(url, { method: req.method, headers, body: req.method === 'POST' ? Buffer.concat(chunks) : undefined });
      const resume = /^\/api\/chat\/([^/]+)\/stream$/.exec(url.pathname);
      const answer = req.method === 'POST' && url.pathname === '/api/chat'
        ? await routes.POST(web)
        : req.method === 'GET' && resume
          ? await routes.GET(web, { params: Promise.resolve({ id: decodeURIComponent(resume[1]!) }) })
          : new Response('not found', { status: 404 });
      res.writeHead(answer.status, Object.fromEntries(answer.headers));
      if (answer.body === null) return void res.end();
      const reader = answer.body.getReader();
      // The page went away: its response is cancelled, as a framework's server does.
      res.on('close', () => void reader.cancel().catch(() => {}));
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        res.write(value);
      }
      res.end();
    })().catch(() => res.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const untrack = track('server', 'the recipe\'s chat routes');
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: async () => {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
      untrack();
    },
  };
}

async function collect(stream: ReadableStream<UIMessageChunk>): Promise<UIMessageChunk[]> {
  const out: UIMessageChunk[] = [];
  for await (const chunk of stream) out.push(chunk);
  return out;
}

const textOf = (chunks: UIMessageChunk[]) => chunks.map((c) => (c.type === 'text-delta' ? c.delta : '')).join('');

describe('the AI SDK resume recipe (useChat({ resume: true }) with Sarsen, no Redis)', function () {
  this.timeout(120_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let dir: string;
  let routes: Routes;
  let app: Awaited<ReturnType<typeof serve>>;
  const savedKey = process.env.SARSEN_KEY;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer();
    t = await provision(server, provider);
    dir = recipeDir();
    const code = docBlock('docs/clients.md', 'recipe-module', 'ai-sdk-resume');
    expect(code).to.include(PAGE_BASE);
    const file = path.join(dir, 'chat-routes.mts');
    fs.writeFileSync(file, code.replaceAll(PAGE_BASE, t.base));
    process.env.SARSEN_KEY = t.key;
    routes = (await import(pathToFileURL(file).href)) as Routes;
    app = await serve(routes);
  });
  after(async () => {
    await app?.close();
    await server?.close();
    await provider?.close();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
    if (savedKey === undefined) delete process.env.SARSEN_KEY;
    else process.env.SARSEN_KEY = savedKey;
  });
  beforeEach(() => provider.reset());

  it('a page that leaves mid-answer and the next one that resumes get the whole message, from one provider call', async () => {
    const texts = Array.from({ length: 12 }, (_, i) => `r${i} `);
    const frames = chatFrames(texts);
    const gates = frames.map(() => gate());
    provider.enqueue({ kind: 'sse', frames, waitBefore: Object.fromEntries(gates.map((g, i) => [i, g.until])) });
    for (const g of gates.slice(0, 4)) g.open();
    const transport = new DefaultChatTransport<UIMessage>({ api: `${app.url}/api/chat` });
    const messages: UIMessage[] = [{ id: 'u1', role: 'user', parts: [{ type: 'text', text: 'resume me' }] }];

    // The first page: reads the start of the answer, then reloads.
    const leaving = new AbortController();
    const first = await transport.sendMessages({ trigger: 'submit-message', chatId: 'chat-1', messageId: undefined, messages, abortSignal: leaving.signal });
    const reader = first.getReader();
    let seen = '';
    while (!seen.includes('r1 ')) {
      const next = await reader.read();
      if (next.done) break;
      if (next.value.type === 'text-delta') seen += next.value.delta;
    }
    expect(seen).to.include('r0 r1 ');
    leaving.abort();
    await reader.cancel().catch(() => {});
    // The answer goes on being written while no page is there.
    for (const g of gates) g.open();

    // The next page: useChat({ resume: true }) asks the resume route on mount.
    const resumed = await transport.reconnectToStream({ chatId: 'chat-1' });
    expect(resumed).to.not.equal(null);
    const chunks = await collect(resumed!);
    expect(chunks[0]!.type).to.equal('start');
    expect(chunks.at(-1)!.type).to.equal('finish');
    expect(textOf(chunks)).to.equal(texts.join(''));
    expect(provider.journal.length).to.equal(1);

    // Done: nothing runs for this chat any more, nor for a chat that never asked.
    expect(routes.activeRequest.get('chat-1')).to.equal(null);
    expect(await transport.reconnectToStream({ chatId: 'chat-1' })).to.equal(null);
    expect(await transport.reconnectToStream({ chatId: 'never-asked' })).to.equal(null);
  });

  it('a page that stays gets its answer as usual, and the chat has nothing left to resume', async () => {
    const transport = new DefaultChatTransport<UIMessage>({ api: `${app.url}/api/chat` });
    const messages: UIMessage[] = [{ id: 'u2', role: 'user', parts: [{ type: 'text', text: 'Say hello, and stay' }] }];
    const chunks = await collect(await transport.sendMessages({ trigger: 'submit-message', chatId: 'chat-2', messageId: undefined, messages, abortSignal: undefined }));
    expect(textOf(chunks).length).to.be.greaterThan(0);
    expect(provider.journal.length).to.equal(1);
    expect(await transport.reconnectToStream({ chatId: 'chat-2' })).to.equal(null);
  });
});
