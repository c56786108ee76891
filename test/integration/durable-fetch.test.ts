// durableFetch (docs/clients.md "Durable fetch") under real breaks: a TCP fault proxy between the
// unmodified SDKs and Sarsen resets the caller's connection mid-stream, several times per stream,
// stalls it, and cuts it before an answer began. Every stream reaches the SDK byte for byte as the
// provider sent it, and the fake provider's journal shows one call.
import { expect } from 'chai';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { createOpenAI } from '@ai-sdk/openai';
import { createAnthropic } from '@ai-sdk/anthropic';
import { streamText } from 'ai';
import { durableFetch, type ResumeInfo } from 'sarsen/client';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatFrames, messagesFrames, chatCompletionBody, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { startFaultProxy, type FaultProxy } from '../support/fault-proxy.ts';
import { gate } from './streaming-support.ts';
import { call } from '../support/control-plane.ts';
import { registerSecret } from '../support/log-guard.ts';

/** A fetch that keeps every byte of each answer body it hands on (what the SDK read). */
function recording(inner: typeof fetch): { fetch: typeof fetch; bodies: Buffer[][] } {
  const bodies: Buffer[][] = [];
  const f = async (input: Parameters<typeof fetch>[0], init?: RequestInit): Promise<Response> => {
    const res = await inner(input, init);
    if (res.body === null) return res;
    const parts: Buffer[] = [];
    bodies.push(parts);
    const [a, b] = res.body.tee();
    void (async () => {
      for await (const chunk of b) parts.push(Buffer.from(chunk));
    })().catch(() => {});
    return new Response(a, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
  return { fetch: f as typeof fetch, bodies };
}

describe('durableFetch: the official SDKs through a breaking connection', function () {
  this.timeout(120_000);
  let server: TestServer;
  let provider: FakeProvider;
  let proxy: FaultProxy;
  let t: Tenant;
  let base: string;
  let root: string;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer({ credentialPassthrough: true });
    const port = Number(new URL(server.url).port);
    proxy = await startFaultProxy({ host: '127.0.0.1', port });
  });
  after(async () => {
    await proxy?.close();
    await server?.close();
    await provider?.close();
  });
  beforeEach(async () => {
    provider.reset();
    proxy.heal();
    // A namespace per test, so no body attaches to another test's request.
    t = await provision(server, provider);
    base = t.base.replace(server.url, `http://127.0.0.1:${proxy.port}`);
    root = t.root.replace(server.url, `http://127.0.0.1:${proxy.port}`);
  });

  const resumes: ResumeInfo[] = [];
  const options = { backoffMs: 20, maxBackoffMs: 200, stallMs: 1500, onResume: (r: ResumeInfo) => void resumes.push(r) };
  beforeEach(() => (resumes.length = 0));

  /** Resets every connection through the proxy, and lets new ones through. */
  const reset = () => {
    proxy.set({ kind: 'reset' });
    proxy.heal();
  };

  it('openai: a chat stream reset three times mid-stream reaches the SDK whole, byte for byte, from one provider call', async () => {
    const frames = chatFrames(Array.from({ length: 24 }, (_, i) => `w${i} `), { usage: true });
    const gates = frames.map(() => gate());
    // The provider writes frame i only once the test let it: the resets land mid-stream, by order.
    provider.enqueue({ kind: 'sse', frames, waitBefore: Object.fromEntries(gates.map((g, i) => [i, g.until])) });
    const rec = recording(durableFetch(options));
    const client = new OpenAI({ baseURL: base, apiKey: t.key, fetch: rec.fetch, maxRetries: 0 });
    const stream = await (async () => {
      gates[0]!.open();
      return client.chat.completions.create({ model: 'gpt-test', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'resets' }] });
    })();
    const seen: string[] = [];
    let n = 0;
    for await (const chunk of stream) {
      n++;
      seen.push(chunk.choices[0]?.delta?.content ?? '');
      if (n === 4 || n === 11 || n === 17) reset();
      gates[n]?.open();
    }
    expect(seen.join('')).to.equal(Array.from({ length: 24 }, (_, i) => `w${i} `).join(''));
    expect(Buffer.concat(rec.bodies[0]!).toString('latin1')).to.equal(frames.join(''));
    expect(provider.journal.length).to.equal(1);
    expect(resumes.filter((r) => r.how === 'replay').length).to.be.at.least(3);
  });

  it('@anthropic-ai/sdk: a messages stream reset mid-stream and stalled reaches the SDK whole, byte for byte, from one provider call', async () => {
    const texts = Array.from({ length: 16 }, (_, i) => `m${i} `);
    const frames = messagesFrames(texts, { lineEnding: '\r\n', ping: false });
    const gates = frames.map(() => gate());
    provider.enqueue({ kind: 'sse', frames, waitBefore: Object.fromEntries(gates.map((g, i) => [i, g.until])) });
    const rec = recording(durableFetch(options));
    const client = new Anthropic({ baseURL: root, apiKey: t.key, fetch: rec.fetch, maxRetries: 0 });
    gates[0]!.open();
    const stream = await client.messages.create({ model: 'claude-test', max_tokens: 64, stream: true, messages: [{ role: 'user', content: 'resets and a stall' }] });
    let n = 0;
    let text = '';
    for await (const event of stream) {
      n++;
      if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') text += event.delta.text;
      // The first connection goes silent (no reset, no FIN): the stall bound finds it out.
      if (n === 2) proxy.set({ kind: 'half-open', newConnections: 'pass' });
      if (n === 3) proxy.heal();
      if (n === 6 || n === 9) reset();
      gates[n]?.open();
    }
    expect(text).to.equal(texts.join(''));
    expect(Buffer.concat(rec.bodies[0]!).toString('latin1')).to.equal(frames.join(''));
    expect(provider.journal.length).to.equal(1);
    expect(resumes.filter((r) => r.how === 'replay').length).to.be.at.least(3);
  });

  it('the AI SDK (openai and anthropic providers): streamText through resets gets every word once, byte for byte, from one provider call each', async () => {
    const texts = Array.from({ length: 10 }, (_, i) => `s${i} `);
    for (const dialect of ['chat', 'messages'] as const) {
      provider.reset();
      resumes.length = 0;
      const frames = dialect === 'chat' ? chatFrames(texts) : messagesFrames(texts, { ping: false });
      const gates = frames.map(() => gate());
      provider.enqueue({ kind: 'sse', frames, waitBefore: Object.fromEntries(gates.map((g, i) => [i, g.until])) });
      const rec = recording(durableFetch(options));
      const model = dialect === 'chat'
        ? createOpenAI({ baseURL: base, apiKey: t.key, fetch: rec.fetch }).chat('gpt-test')
        : createAnthropic({ baseURL: `${root}/v1`, apiKey: 'unused', headers: { 'x-sarsen-key': t.key }, fetch: rec.fetch })('claude-test');
      // The frames that carry no text, and the first that does, at once; then one more per word
      // read, so the resets land mid-stream.
      let opened = frames.length - texts.length + 1;
      for (const g of gates.slice(0, opened)) g.open();
      let failure: unknown;
      const result = streamText({ model, prompt: `through resets, ${dialect}`, maxOutputTokens: 64, maxRetries: 0, onError: ({ error }) => void (failure = error) });
      let text = '';
      let n = 0;
      for await (const delta of result.textStream) {
        text += delta;
        n++;
        if (n === 2 || n === 5) reset();
        gates[opened++]?.open();
      }
      expect(failure, String(failure)).to.equal(undefined);
      expect(text).to.equal(texts.join(''));
      expect(Buffer.concat(rec.bodies[0]!).toString('latin1')).to.equal(frames.join(''));
      expect(provider.journal.length).to.equal(1);
      expect(resumes.filter((r) => r.how === 'replay').length).to.be.at.least(1);
    }
  });

  it('a stream whose connection breaks before its first frame finds its request again by its body, attach-only, with one provider call', async () => {
    const frames = chatFrames(['before ', 'the ', 'answer']);
    const first = gate();
    provider.enqueue({ kind: 'sse', frames, waitBefore: { 0: first.until } });
    const rec = recording(durableFetch(options));
    const client = new OpenAI({ baseURL: base, apiKey: t.key, fetch: rec.fetch, maxRetries: 0 });
    const created = client.chat.completions.create({ model: 'gpt-test', stream: true, messages: [{ role: 'user', content: 'cut early' }] });
    await provider.waitForRequests(1);
    reset();
    // The re-sent body is attach-only: it lands on the execution before the first frame exists.
    await until(() => resumes.some((r) => r.how === 'attach'));
    first.open();
    let text = '';
    for await (const chunk of await created) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).to.equal('before the answer');
    expect(Buffer.concat(rec.bodies[0]!).toString('latin1')).to.equal(frames.join(''));
    expect(provider.journal.length).to.equal(1);
  });

  it('a call that is not a stream and loses its connection gets the stored answer, with one provider call', async () => {
    const answered = gate();
    const body = chatCompletionBody('held and found', { id: 'chatcmpl-held' });
    provider.enqueue({ kind: 'json', body, after: answered.until });
    const client = new OpenAI({ baseURL: base, apiKey: t.key, fetch: durableFetch(options), maxRetries: 0 });
    const created = client.chat.completions.create({ model: 'gpt-test', messages: [{ role: 'user', content: 'not a stream' }] });
    await provider.waitForRequests(1);
    reset();
    await until(() => resumes.length > 0);
    answered.open();
    const completion = await created;
    expect(completion.id).to.equal('chatcmpl-held');
    expect(completion.choices[0]!.message.content).to.equal('held and found');
    expect(provider.journal.length).to.equal(1);
  });

  it('a refusal reaches each SDK as plain fetch gives it: its own error class, status, body and retry-after', async () => {
    const refusal = { error: { message: 'no such thing', type: 'invalid_request_error', param: null, code: 'nope' } };
    const caught = async (f: typeof fetch) => {
      provider.enqueue({ kind: 'refuse', status: 422, body: refusal, retryAfter: '7' });
      const client = new OpenAI({ baseURL: base, apiKey: t.key, fetch: f, maxRetries: 0 });
      return client.chat.completions.create({ model: 'gpt-test', messages: [{ role: 'user', content: 'refused' }] }).then(
        () => expect.fail('not refused'),
        (err: unknown) => err,
      );
    };
    const plain = (await caught(fetch)) as InstanceType<typeof OpenAI.APIError>;
    const durable = (await caught(durableFetch(options))) as InstanceType<typeof OpenAI.APIError>;
    expect(durable).to.be.instanceOf(OpenAI.UnprocessableEntityError);
    expect(plain).to.be.instanceOf(OpenAI.UnprocessableEntityError);
    expect(durable.status).to.equal(plain.status);
    expect(durable.error).to.deep.equal(plain.error);
    expect(durable.headers?.get('retry-after')).to.equal('7');
    expect(plain.headers?.get('retry-after')).to.equal('7');

    provider.enqueue({ kind: 'refuse', status: 400, retryAfter: '3' });
    const anthropic = new Anthropic({ baseURL: root, apiKey: t.key, fetch: durableFetch(options), maxRetries: 0 });
    const err = await anthropic.messages.create({ model: 'claude-test', max_tokens: 8, stream: true, messages: [{ role: 'user', content: 'refused' }] }).then(
      () => expect.fail('not refused'),
      (e: unknown) => e as InstanceType<typeof Anthropic.APIError>,
    );
    expect(err).to.be.instanceOf(Anthropic.BadRequestError);
    expect(err.headers?.get('retry-after')).to.equal('3');
    expect(provider.journal.length).to.equal(3);
  });

  it('a caller-credential backend: the credential is part of what attaches, and a resume by id sends the Sarsen key alone', async () => {
    const b = await call(server.url, 'POST', `/${t.tenancy}/v1/namespaces/${t.namespace}/backends`, {
      token: t.adminToken,
      body: { name: 'byok', kind: 'chat_compat', address: `${provider.url}/v1`, credential_source: 'caller' },
    });
    expect(b.status, b.text).to.equal(201);
    await call(server.url, 'POST', `/${t.tenancy}/v1/namespaces/${t.namespace}/routing-rules`, { token: t.adminToken, body: { model: 'byok-*', backend_id: b.body.backend_id } });
    const mine = 'sk-caller-credential-of-this-test';
    registerSecret(mine);
    const frames = chatFrames(Array.from({ length: 8 }, (_, i) => `c${i} `));
    const gates = frames.map(() => gate());
    provider.enqueue({ kind: 'sse', frames, waitBefore: Object.fromEntries(gates.map((g, i) => [i, g.until])) });
    const reads: Headers[] = [];
    const rec = recording(durableFetch({ ...options, fetch: (input, init) => {
      if ((init?.method ?? 'GET') === 'GET') reads.push(new Headers(init?.headers));
      return fetch(input, init);
    } }));
    const client = new OpenAI({ baseURL: base, apiKey: mine, defaultHeaders: { 'x-sarsen-key': t.key }, fetch: rec.fetch, maxRetries: 0 });
    const created = client.chat.completions.create({ model: 'byok-gpt', stream: true, messages: [{ role: 'user', content: 'my own credential' }] });
    // Cut before the first frame (found again by body and credential), then mid-stream (by id).
    await provider.waitForRequests(1);
    reset();
    await until(() => resumes.some((r) => r.how === 'attach'));
    gates[0]!.open();
    let n = 0;
    for await (const _ of await created) {
      n++;
      if (n === 3) reset();
      gates[n]?.open();
    }
    expect(Buffer.concat(rec.bodies[0]!).toString('latin1')).to.equal(frames.join(''));
    expect(provider.journal.length).to.equal(1);
    expect(provider.journal[0]!.headers.authorization).to.equal(`Bearer ${mine}`);
    expect(reads.length).to.be.at.least(1);
    for (const h of reads) {
      expect(h.get('x-sarsen-key')).to.equal(t.key);
      expect(h.get('authorization')).to.equal(null);
    }
  });

  it('x-sarsen-attach: only lands on a live execution of the body, and where there is none answers 404 and submits nothing', async () => {
    const plainHeaders = { 'content-type': 'application/json', authorization: `Bearer ${t.key}` };
    const headers = { ...plainHeaders, 'x-sarsen-attach': 'only' };
    const body = JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: 'attach only' }] });
    const none = await fetch(`${t.base}/chat/completions`, { method: 'POST', headers, body });
    expect(none.status).to.equal(404);
    expect(none.headers.get('x-sarsen-request-id')).to.equal(null);
    const listing = await fetch(`${t.base}/requests`, { headers: { authorization: `Bearer ${t.key}` } });
    expect(((await listing.json()) as { data: unknown[] }).data).to.deep.equal([]);
    expect(provider.journal.length).to.equal(0);

    const plain = await fetch(`${t.base}/chat/completions`, { method: 'POST', headers: plainHeaders, body });
    const id = plain.headers.get('x-sarsen-request-id');
    const answer = await plain.text();
    const attached = await fetch(`${t.base}/chat/completions`, { method: 'POST', headers, body });
    expect(attached.headers.get('x-sarsen-request-id')).to.equal(id);
    expect(await attached.text()).to.equal(answer);
    expect(provider.journal.length).to.equal(1);
  });
});

async function until(pred: () => boolean, timeoutMs = 20_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!pred()) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 10));
  }
}
