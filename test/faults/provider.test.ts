// The provider side, bounded end to end (docs/api.md "Provider timeouts"): over real sockets, a
// provider that is never connected to, that accepts and never answers, that sends headers and
// then nothing, that stalls in the middle of a stream, that closes or resets its connection,
// or whose link goes half-open (through test/support/fault-proxy.ts). Each case ends within
// the bound the settings give, retried as "Outcomes and retries" says, with the record ending
// as the caller was told. The timeouts are set short and the bounds computed from them have
// generous slack, so a wait that were unbounded, or a timeout that were not applied, fails
// here, and a slow host does not. What each case measured goes to docs/reliability.md.
import { expect } from 'chai';
import crypto from 'node:crypto';
import net from 'node:net';
import { spawn } from 'node:child_process';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatFrames, messagesFrames, messagesBody, defaultAnswer, type FakeProvider, type JournalEntry } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json, until, type RawResponse } from '../support/http.ts';
import { call } from '../support/control-plane.ts';
import { registerSecret } from '../support/log-guard.ts';
import { startFaultProxy, type FaultProxy } from '../support/fault-proxy.ts';
import { postStream, bytesOf, failedEventData, gate } from '../integration/streaming-support.ts';
import { createReport, seconds } from './report.ts';

// The settings under test, and the bounds they give (docs/api.md "Provider timeouts").
const CONNECT_MS = 1000;
const HEADERS_MS = 1500;
const IDLE_MS = 1500;
const RETRY_BASE_MS = 50;
const RETRY_MAX_MS = 100;
const MAX_ATTEMPTS = 3;
// Longer than any case takes, so the hold never decides one (an unbounded wait would show as
// a 504 after it, or as this suite's own deadline).
const HOLD_MS = 30_000;

/** The most backoff `retries` retries may wait: min(retry_max_ms, retry_base_ms * 2^(n-1)) each. */
const backoff = (retries: number): number => {
  let total = 0;
  for (let n = 1; n <= retries; n++) total += Math.min(RETRY_MAX_MS, RETRY_BASE_MS * 2 ** (n - 1));
  return total;
};
// What docs/api.md adds to the settings: a timeout of a second or more may fire up to half a
// second late (undici checks those timers twice a second), and a retry is picked up within a
// second of its backoff (the job queue's poll).
const TIMER_LATE_MS = 500;
const RETRY_PICKUP_MS = 1000;
// Slack on top, for a loaded 2-core host: records and frames are committed, the caller's
// answer is written. Generous on purpose: the bounds below are seconds, the defaults they
// replace are minutes.
const SLACK_MS = 2500;
const PER_ATTEMPT_SLACK_MS = 500;
/** The bound on `attempts` attempts, `timedOut` of which ran into a timeout of `timeoutMs`. */
const bound = (attempts: number, timedOut: number, timeoutMs: number): number =>
  timedOut * (timeoutMs + TIMER_LATE_MS) + backoff(attempts - 1) + (attempts - 1) * RETRY_PICKUP_MS + attempts * PER_ATTEMPT_SLACK_MS + SLACK_MS;
// A timer may fire late, never much early.
const atLeast = (ms: number): number => ms - 100;

// A child process listening with an accept queue of one, which it never drains (its event loop
// is blocked once listening): prints its port.
const FULL_LISTENER = `const s = require('net').createServer();
s.listen({ port: 0, host: '127.0.0.1', backlog: 1 }, () => {
  process.stdout.write(s.address().port + '\\n', () => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0));
});`;

/** Rejects when `p` has not settled within `ms`: the case was not bounded. */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not over within ${ms} ms`)), ms);
  });
  return Promise.race([p, deadline]).finally(() => clearTimeout(timer));
}

describe('faults: the provider side is bounded end to end', function () {
  this.timeout(60_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let unique = 0;
  // Gates the provider waits on forever unless a test opens them; all opened after each test.
  const gates: { open(): void }[] = [];
  const never = (): Promise<void> => {
    const g = gate();
    gates.push(g);
    return g.until;
  };
  const model = (family: 'gpt' | 'claude') => `${family}-fault-${process.pid}-${++unique}`;
  const chat = (m: string, stream: boolean) => ({ model: m, stream, messages: [{ role: 'user', content: `case ${m}` }] });
  const messages = (m: string, stream: boolean) => ({ model: m, max_tokens: 16, stream, messages: [{ role: 'user', content: `case ${m}` }] });

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer({
      settings: {
        upstream_connect_timeout_ms: CONNECT_MS,
        upstream_headers_timeout_ms: HEADERS_MS,
        upstream_idle_timeout_ms: IDLE_MS,
        retry_base_ms: RETRY_BASE_MS,
        retry_max_ms: RETRY_MAX_MS,
        max_attempts: MAX_ATTEMPTS,
        synchronous_hold_ms: HOLD_MS,
      },
    });
    t = await provision(server, provider);
  });
  after(async () => {
    for (const g of gates.splice(0)) g.open();
    await server?.close();
    await provider?.close();
  });
  beforeEach(() => provider.reset());
  afterEach(() => {
    for (const g of gates.splice(0)) g.open();
  });

  const post = (path: string, body: unknown, timeoutMs: number): Promise<RawResponse> =>
    rawRequest(`${t.base}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify(body),
      timeoutMs,
    });

  /** The record of the one request made with `m`, once it is terminal: found through the listing. */
  const recordOf = async (m: string) => {
    const listed = await until(async () => {
      const res = await rawRequest(`${t.base}/requests?model=${encodeURIComponent(m)}`, { headers: { 'x-sarsen-key': t.key } });
      const rows = json(res).data as { request_id: string; status: string }[];
      return rows.length === 1 && (rows[0]!.status === 'succeeded' || rows[0]!.status === 'failed') ? rows : undefined;
    }, 10_000);
    return json(await rawRequest(`${t.base}/requests/${listed[0]!.request_id}`, { headers: { 'x-sarsen-key': t.key } }));
  };

  /** The provider calls of this case, each of which Sarsen ended (none left open behind it). */
  const calls = async (n: number): Promise<JournalEntry[]> => {
    await provider.waitUntil(() => provider.journal.length >= n && provider.journal.every((e) => e.finishedAt !== undefined), 5000);
    return provider.journal.slice();
  };

  const expectAttempts = (rec: any, status: string, outcomes: string[], error?: RegExp) => {
    expect(rec.status).to.equal(status);
    expect(rec.attempts).to.equal(outcomes.length);
    expect(rec.attempt_log.map((a: { outcome: string }) => a.outcome)).to.deep.equal(outcomes);
    if (error) for (const a of rec.attempt_log.filter((a: { outcome: string }) => a.outcome !== 'succeeded')) expect(a.error).to.match(error);
  };

  describe('(0) the connection is never made', () => {
    it('a handshake that never completes (chat, not streamed): each attempt ends at the connect timeout, then 502 upstream_failed', async () => {
      // A listener whose accept queue is full and never drained: the kernel drops further SYNs,
      // so a connect neither succeeds nor fails.
      const listener = spawn(process.execPath, ['-e', FULL_LISTENER], { stdio: ['ignore', 'pipe', 'inherit'] });
      listener.on('error', () => undefined); // a failed spawn shows as the port never printed
      const exited = new Promise((resolve) => listener.once('close', resolve));
      const fill: net.Socket[] = [];
      try {
        const port = await new Promise<number>((resolve, reject) => {
          listener.stdout!.once('data', (d: Buffer) => resolve(Number(String(d).trim())));
          listener.once('close', () => reject(new Error('the listener exited')));
        });
        // Its queue holds two: fill it (a third connect stays pending, as Sarsen's will).
        for (let i = 0; i < 3; i++) {
          const s = net.connect(port, '127.0.0.1');
          s.on('error', () => undefined);
          fill.push(s);
        }
        await until(async () => (fill.filter((s) => !s.connecting).length >= 2 ? true : undefined), 5000);
        expect(fill[2]!.connecting, 'the listener takes no more connections').to.equal(true);
        const m = await routeTo('chat', port);
        const limit = bound(MAX_ATTEMPTS, MAX_ATTEMPTS, CONNECT_MS);
        const started = performance.now();
        const res = await post('/chat/completions', chat(m, false), limit);
        const elapsed = performance.now() - started;
        expect(res.status).to.equal(502);
        expect(json(res).error.message).to.equal('Connecting to the provider timed out.');
        expect(elapsed, 'every attempt waited the connect timeout').to.be.at.least(atLeast(MAX_ATTEMPTS * CONNECT_MS));
        expect(elapsed).to.be.below(limit);
        const rec = await recordOf(m);
        expectAttempts(rec, 'failed', ['retried', 'retried', 'failed'], /Connecting to the provider timed out/);
        report('(0) chat connect never completes x3', elapsed, 0);
      } finally {
        for (const s of fill) s.destroy();
        listener.kill('SIGKILL');
        await exited;
      }
    });

    it('a refused connection (messages, streamed): retried without a timeout, then 502 upstream_failed; no provider call', async () => {
      // A port nothing listens on any more.
      const closed = net.createServer();
      await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
      const port = (closed.address() as net.AddressInfo).port;
      await new Promise((resolve) => closed.close(resolve));
      const m = await routeTo('messages', port);
      const limit = bound(MAX_ATTEMPTS, 0, 0);
      const started = performance.now();
      const res = await within(postStream(t, '/messages', messages(m, true)).done, limit, 'a refused stream');
      const elapsed = performance.now() - started;
      expect(res.status).to.equal(502);
      expect(JSON.parse(res.body.toString()).error.message).to.equal('The provider refused the connection.');
      expect(elapsed, 'no timeout was waited for').to.be.below(backoff(MAX_ATTEMPTS - 1) + (MAX_ATTEMPTS - 1) * RETRY_PICKUP_MS + CONNECT_MS);
      expectAttempts(await recordOf(m), 'failed', ['retried', 'retried', 'failed'], /refused the connection/);
      report('(0) messages stream connection refused x3', elapsed, 0);
    });
  });

  describe('(1) the provider accepts the connection and never sends headers', () => {
    it('chat, not streamed: each attempt ends at the headers timeout, retried up to max_attempts, then 502 upstream_failed', async () => {
      const m = model('gpt');
      provider.enqueue({ kind: 'hang' }, { kind: 'hang' }, { kind: 'hang' });
      const limit = bound(MAX_ATTEMPTS, MAX_ATTEMPTS, HEADERS_MS);
      const started = performance.now();
      const res = await post('/chat/completions', chat(m, false), limit);
      const elapsed = performance.now() - started;
      expect(res.status).to.equal(502);
      expect(json(res).error.code).to.equal('upstream_failed');
      expect(json(res).error.message).to.equal('The provider sent no response headers in time.');
      expect(elapsed, 'every attempt waited the headers timeout').to.be.at.least(atLeast(MAX_ATTEMPTS * HEADERS_MS));
      expect(elapsed).to.be.below(limit);
      const journal = await calls(MAX_ATTEMPTS);
      expect(journal).to.have.length(MAX_ATTEMPTS);
      expect(journal.every((e) => e.clientAborted), 'Sarsen closed each silent call').to.equal(true);
      const rec = await recordOf(m);
      expectAttempts(rec, 'failed', ['retried', 'retried', 'failed'], /no response headers in time/);
      expect(rec.error).to.deep.equal(json(res));
      expect(rec).to.not.have.property('error_status');
      report('(1) chat no headers x3', elapsed, journal.length);
    });

    it('messages, streamed: the silent attempt is retried and the caller gets the next attempt\'s stream', async () => {
      const m = model('claude');
      provider.enqueue({ kind: 'hang' });
      const limit = bound(2, 1, HEADERS_MS);
      const started = performance.now();
      const reader = postStream(t, '/messages', messages(m, true));
      const done = await within(reader.done, limit, 'a retried stream');
      const elapsed = performance.now() - started;
      expect(done.status).to.equal(200);
      expect(done.complete).to.equal(true);
      expect(done.body.toString()).to.include('event: message_stop');
      expect(done.body.toString()).to.include(JSON.stringify(defaultAnswer(messages(m, true)).text).slice(1, 12));
      expect(elapsed).to.be.at.least(atLeast(HEADERS_MS));
      const journal = await calls(2);
      expect(journal).to.have.length(2);
      expect(journal[0]!.clientAborted).to.equal(true);
      expectAttempts(await recordOf(m), 'succeeded', ['retried', 'succeeded'], /no response headers in time/);
      report('(1) messages stream no headers, then success', elapsed, journal.length);
    });
  });

  describe('(2) the provider sends headers and then nothing', () => {
    it('chat, streamed: no first frame within the idle timeout is a failure before the stream, retried, then 502 upstream_failed', async () => {
      const m = model('gpt');
      const silent = () => ({ kind: 'sse' as const, frames: chatFrames(['never']), waitBefore: { 0: never() } });
      provider.enqueue(silent(), silent(), silent());
      const limit = bound(MAX_ATTEMPTS, MAX_ATTEMPTS, IDLE_MS);
      const started = performance.now();
      const res = await within(postStream(t, '/chat/completions', chat(m, true)).done, limit, 'a stream with headers and no frame');
      const elapsed = performance.now() - started;
      expect(res.status).to.equal(502);
      expect(JSON.parse(res.body.toString()).error.code).to.equal('upstream_failed');
      expect(JSON.parse(res.body.toString()).error.message).to.equal('The provider went silent in the middle of its answer.');
      expect(elapsed, 'every attempt waited the idle timeout').to.be.at.least(atLeast(MAX_ATTEMPTS * IDLE_MS));
      const journal = await calls(MAX_ATTEMPTS);
      expect(journal).to.have.length(MAX_ATTEMPTS);
      expect(journal.every((e) => e.clientAborted)).to.equal(true);
      expectAttempts(await recordOf(m), 'failed', ['retried', 'retried', 'failed'], /went silent/);
      report('(2) chat stream headers only', elapsed, journal.length);
    });

    it('messages, not streamed: an answer whose body never comes is retried, and the caller gets the attempt that answered', async () => {
      const m = model('claude');
      // 200 application/json, headers flushed, then nothing.
      const silent = () => ({ kind: 'sse' as const, frames: [JSON.stringify(messagesBody('never'))], headers: { 'content-type': 'application/json' }, waitBefore: { 0: never() } });
      provider.enqueue(silent(), silent());
      const limit = bound(MAX_ATTEMPTS, 2, IDLE_MS);
      const started = performance.now();
      const res = await post('/messages', messages(m, false), limit);
      const elapsed = performance.now() - started;
      expect(res.status).to.equal(200);
      expect(json(res).type).to.equal('message');
      expect(json(res).content[0].text).to.equal(defaultAnswer(messages(m, false)).text);
      expect(elapsed).to.be.at.least(atLeast(2 * IDLE_MS));
      const journal = await calls(MAX_ATTEMPTS);
      expect(journal).to.have.length(MAX_ATTEMPTS);
      expect(journal.map((e) => e.clientAborted)).to.deep.equal([true, true, false]);
      expectAttempts(await recordOf(m), 'succeeded', ['retried', 'retried', 'succeeded'], /went silent/);
      report('(2) messages non-stream headers only x2, then success', elapsed, journal.length);
    });

    it('chat, not streamed: the same, every attempt, is 502 upstream_failed', async () => {
      const m = model('gpt');
      const silent = () => ({ kind: 'sse' as const, frames: ['{}'], headers: { 'content-type': 'application/json' }, waitBefore: { 0: never() } });
      provider.enqueue(silent(), silent(), silent());
      const limit = bound(MAX_ATTEMPTS, MAX_ATTEMPTS, IDLE_MS);
      const started = performance.now();
      const res = await post('/chat/completions', chat(m, false), limit);
      const elapsed = performance.now() - started;
      expect(res.status).to.equal(502);
      expect(json(res).error.message).to.equal('The provider went silent in the middle of its answer.');
      expect(elapsed).to.be.at.least(atLeast(MAX_ATTEMPTS * IDLE_MS));
      const journal = await calls(MAX_ATTEMPTS);
      expect(journal).to.have.length(MAX_ATTEMPTS);
      expectAttempts(await recordOf(m), 'failed', ['retried', 'retried', 'failed'], /went silent/);
      report('(2) chat non-stream headers only', elapsed, journal.length);
    });
  });

  describe('(3) the provider stalls in the middle of a stream', () => {
    const stall = async (path: string, body: unknown, frames: string[], sentBefore: number, m: string, label: string) => {
      provider.enqueue({ kind: 'sse', frames, frameDelayMs: 5, waitBefore: { [sentBefore]: never() } });
      const reader = postStream(t, path, body);
      const sent = bytesOf(frames.slice(0, sentBefore)).toString();
      await within(reader.waitFor((text) => text.length >= sent.length), 10_000, 'the frames before the stall');
      const stalledAt = performance.now();
      const limit = bound(1, 1, IDLE_MS);
      const res = await within(reader.done, limit, 'a stalled stream');
      const elapsed = performance.now() - stalledAt;
      expect(res.status).to.equal(200);
      expect(res.complete, 'the stream ended as an answer, not a cut connection').to.equal(true);
      const text = res.body.toString();
      expect(text.startsWith(sent)).to.equal(true);
      const tail = text.slice(sent.length);
      expect(tail).to.match(/^event: failed\ndata: .+\n\n$/);
      expect(elapsed, 'the idle timeout ended it').to.be.at.least(atLeast(IDLE_MS));
      const journal = await calls(1);
      expect(journal, 'terminal after the first frame: no second call').to.have.length(1);
      expect(journal[0]!.clientAborted).to.equal(true);
      const rec = await recordOf(m);
      expectAttempts(rec, 'failed', ['failed'], /went silent/);
      expect(failedEventData(tail)).to.deep.equal(rec.error);
      expect(rec.error.error.code).to.equal('upstream_failed');
      report(label, elapsed, journal.length);
    };

    it('chat: event: failed one idle timeout after the last frame, not retried, the record failed', async () => {
      const m = model('gpt');
      await stall('/chat/completions', chat(m, true), chatFrames(['one', 'two', 'three']), 2, m, '(3) chat stall after 2 frames');
    });

    it('messages: the same', async () => {
      const m = model('claude');
      await stall('/messages', messages(m, true), messagesFrames(['one', 'two', 'three']), 4, m, '(3) messages stall after 4 frames');
    });
  });

  describe('(4) the provider closes or resets the connection', () => {
    it('before headers, every attempt: retried without waiting for any timeout, then 502 upstream_failed', async () => {
      const m = model('gpt');
      provider.enqueue({ kind: 'drop' }, { kind: 'drop' }, { kind: 'drop' });
      const limit = bound(MAX_ATTEMPTS, 0, 0);
      const started = performance.now();
      const res = await post('/chat/completions', chat(m, false), limit);
      const elapsed = performance.now() - started;
      expect(res.status).to.equal(502);
      expect(json(res).error.code).to.equal('upstream_failed');
      expect(elapsed).to.be.below(limit);
      // Less than one headers timeout beyond the retries' own wait: no timeout was waited for.
      expect(elapsed, 'no timeout was waited for').to.be.below(backoff(MAX_ATTEMPTS - 1) + (MAX_ATTEMPTS - 1) * RETRY_PICKUP_MS + HEADERS_MS);
      const journal = await calls(MAX_ATTEMPTS);
      expect(journal).to.have.length(MAX_ATTEMPTS);
      expectAttempts(await recordOf(m), 'failed', ['retried', 'retried', 'failed']);
      report('(4) chat close before headers x3', elapsed, journal.length);
    });

    it('before headers, once (messages, streamed): the retry answers', async () => {
      const m = model('claude');
      provider.enqueue({ kind: 'drop' });
      const limit = bound(2, 0, 0);
      const started = performance.now();
      const res = await within(postStream(t, '/messages', messages(m, true)).done, limit, 'a stream retried after a close');
      const elapsed = performance.now() - started;
      expect(res.status).to.equal(200);
      expect(res.body.toString()).to.include('event: message_stop');
      const journal = await calls(2);
      expect(journal).to.have.length(2);
      expectAttempts(await recordOf(m), 'succeeded', ['retried', 'succeeded']);
      report('(4) messages stream close before headers, then success', elapsed, journal.length);
    });

    it('mid-stream: event: failed at once after the frames sent, not retried', async () => {
      const m = model('gpt');
      const frames = chatFrames(['one', 'two', 'three', 'four']);
      provider.enqueue({ kind: 'sse', frames, frameDelayMs: 5, dropAfter: 3 });
      const started = performance.now();
      const res = await within(postStream(t, '/chat/completions', chat(m, true)).done, bound(1, 0, 0), 'a stream whose connection closed');
      const elapsed = performance.now() - started;
      const sent = bytesOf(frames.slice(0, 3)).toString();
      expect(res.body.toString().startsWith(sent)).to.equal(true);
      expect(res.body.toString().slice(sent.length)).to.match(/^event: failed\ndata: .+\n\n$/);
      expect(elapsed).to.be.below(IDLE_MS);
      const journal = await calls(1);
      expect(journal).to.have.length(1);
      expectAttempts(await recordOf(m), 'failed', ['failed']);
      report('(4) chat close mid-stream', elapsed, journal.length);
    });
  });

  /** A model routed to a backend of its own at 127.0.0.1:`port` (so no other case's pooled connection is used). */
  const routeTo = async (dialect: 'chat' | 'messages', port: number): Promise<string> => {
    const m = model(dialect === 'chat' ? 'gpt' : 'claude');
    const credential = `sk-fault-${crypto.randomBytes(12).toString('hex')}`;
    registerSecret(credential);
    const admin = async (path: string, body: unknown) => {
      const res = await call(server.url, 'POST', `/${t.tenancy}/v1/namespaces/${t.namespace}${path}`, { token: t.adminToken, body });
      if (res.status >= 300) throw new Error(`POST ${path}: ${res.status} ${res.text}`);
      return res.body;
    };
    const address = dialect === 'chat' ? `http://127.0.0.1:${port}/v1` : `http://127.0.0.1:${port}`;
    const backend = await admin('/backends', { name: `fault-${unique}`, kind: dialect === 'chat' ? 'chat_compat' : 'messages', address, credential });
    await admin('/routing-rules', { model: m, backend_id: backend.backend_id, action: 'route' });
    return m;
  };
  /** A fault proxy between Sarsen and the fake provider, and a model routed through it. */
  const viaProxy = async (dialect: 'chat' | 'messages'): Promise<{ proxy: FaultProxy; model: string }> => {
    const target = new URL(provider.url);
    const proxy = await startFaultProxy({ host: target.hostname, port: Number(target.port) });
    try {
      return { proxy, model: await routeTo(dialect, proxy.port) };
    } catch (err) {
      await proxy.close();
      throw err;
    }
  };
  /** Runs `body` with a proxied model, closing the proxy however it ends. */
  const withProxy = async (dialect: 'chat' | 'messages', body: (proxy: FaultProxy, m: string) => Promise<void>) => {
    const { proxy, model: m } = await viaProxy(dialect);
    try {
      await body(proxy, m);
    } finally {
      await proxy.close();
    }
  };

  describe('(4) the connection is reset (RST, through a fault proxy)', () => {
    it('before headers (chat, not streamed): the reset attempt is retried without a timeout, and the next one answers', () =>
      withProxy('chat', async (proxy, m) => {
        provider.enqueue({ kind: 'hang' });
        const answer = post('/chat/completions', chat(m, false), bound(2, 1, HEADERS_MS));
        await provider.waitForRequests(1, 10_000);
        const resetAt = performance.now();
        proxy.set({ kind: 'reset' });
        const res = await answer;
        const elapsed = performance.now() - resetAt;
        expect(res.status).to.equal(200);
        expect(json(res).choices[0].message.content).to.equal(defaultAnswer(chat(m, false)).text);
        expect(elapsed).to.be.below(bound(2, 0, 0));
        expect(elapsed, 'the reset, not the headers timeout, ended the first attempt').to.be.below(RETRY_PICKUP_MS + backoff(1) + HEADERS_MS);
        const journal = await calls(2);
        expect(journal).to.have.length(2);
        expectAttempts(await recordOf(m), 'succeeded', ['retried', 'succeeded'], /closed the connection/);
        report('(4) chat RST before headers, then success (from the reset)', elapsed, journal.length);
      }));

    it('at every connect (chat, streamed): max_attempts attempts, none reaching the provider, then 502 upstream_failed', () =>
      withProxy('chat', async (proxy, m) => {
        proxy.set({ kind: 'refuse' });
        const limit = bound(MAX_ATTEMPTS, 0, 0);
        const started = performance.now();
        const res = await within(postStream(t, '/chat/completions', chat(m, true)).done, limit, 'a stream whose connections were reset');
        const elapsed = performance.now() - started;
        expect(res.status).to.equal(502);
        expect(JSON.parse(res.body.toString()).error.code).to.equal('upstream_failed');
        expect(elapsed, 'no timeout was waited for').to.be.below(backoff(MAX_ATTEMPTS - 1) + (MAX_ATTEMPTS - 1) * RETRY_PICKUP_MS + HEADERS_MS);
        expect(proxy.stats().accepted).to.equal(MAX_ATTEMPTS);
        expect(provider.journal, 'no call reached the provider').to.have.length(0);
        expectAttempts(await recordOf(m), 'failed', ['retried', 'retried', 'failed']);
        report('(4) chat stream RST at every connect', elapsed, proxy.stats().accepted);
      }));

    it('mid-stream (messages): event: failed at once after the frames that arrived, not retried', () =>
      withProxy('messages', async (proxy, m) => {
        const frames = messagesFrames(Array.from({ length: 40 }, (_, i) => `w${i} `));
        provider.enqueue({ kind: 'sse', frames, frameDelayMs: 50 });
        const reader = postStream(t, '/messages', messages(m, true));
        await within(reader.waitFor((text) => text.includes('content_block_delta')), 10_000, 'the first frames');
        const resetAt = performance.now();
        proxy.set({ kind: 'reset' });
        const res = await within(reader.done, bound(1, 0, 0), 'a reset stream');
        const elapsed = performance.now() - resetAt;
        expect(res.status).to.equal(200);
        expect(res.complete).to.equal(true);
        const text = res.body.toString();
        expect(text).to.match(/\n\nevent: failed\ndata: .+\n\n$/);
        const before = text.slice(0, text.lastIndexOf('event: failed'));
        expect(frames.map((f) => f.toString()).join('').startsWith(before), 'the frames before it are the provider\'s').to.equal(true);
        expect(elapsed).to.be.below(IDLE_MS);
        const journal = await calls(1);
        expect(journal).to.have.length(1);
        const rec = await recordOf(m);
        expectAttempts(rec, 'failed', ['failed'], /closed the connection/);
        expect(failedEventData(text.slice(before.length))).to.deep.equal(rec.error);
        report('(4) messages RST mid-stream (from the reset)', elapsed, journal.length);
      }));
  });

  describe('(5) the link goes half-open: bytes dropped both ways, no FIN or RST', () => {
    it('mid-stream (chat): event: failed one idle timeout after the link died, while the provider is still sending', () =>
      withProxy('chat', async (proxy, m) => {
        // 6 s of frames: the provider is still writing into the dead link when Sarsen gives up.
        const frames = chatFrames(Array.from({ length: 60 }, (_, i) => `w${i} `));
        provider.enqueue({ kind: 'sse', frames, frameDelayMs: 100 });
        const reader = postStream(t, '/chat/completions', chat(m, true));
        const sent = bytesOf(frames.slice(0, 3)).toString();
        await within(reader.waitFor((text) => text.length >= sent.length), 10_000, 'the first frames');
        const deadAt = performance.now();
        proxy.set({ kind: 'half-open' });
        const res = await within(reader.done, bound(1, 1, IDLE_MS), 'a stream on a half-open link');
        const elapsed = performance.now() - deadAt;
        expect(res.status).to.equal(200);
        expect(res.complete).to.equal(true);
        const text = res.body.toString();
        const before = text.slice(0, text.lastIndexOf('event: failed'));
        expect(before.length).to.be.at.least(sent.length);
        expect(bytesOf(frames).toString().startsWith(before)).to.equal(true);
        expect(text.slice(before.length)).to.match(/^event: failed\ndata: .+\n\n$/);
        // The idle timer last restarted at the frame before the link died (100 ms apart).
        expect(elapsed, 'the idle timeout ended it').to.be.at.least(atLeast(IDLE_MS) - 100);
        expect(proxy.stats().forgotten).to.equal(1);
        expect(provider.journal).to.have.length(1);
        expect(provider.journal[0]!.finishedAt, 'the provider was told nothing: still sending').to.equal(undefined);
        const rec = await recordOf(m);
        expectAttempts(rec, 'failed', ['failed'], /went silent/);
        expect(failedEventData(text.slice(before.length))).to.deep.equal(rec.error);
        report('(5) chat half-open mid-stream (from the link dying)', elapsed, provider.journal.length);
      }));

    it('before headers (messages, not streamed): the headers timeout ends the attempt, and the retry on a new connection answers', () =>
      withProxy('messages', async (proxy, m) => {
        // The first answer comes after the link died; it is written into nothing.
        provider.enqueue({ kind: 'json', body: messagesBody('lost'), delayMs: 300 });
        const started = performance.now();
        const answer = post('/messages', messages(m, false), bound(2, 1, HEADERS_MS));
        await provider.waitForRequests(1, 10_000);
        proxy.set({ kind: 'half-open', newConnections: 'pass' });
        const res = await answer;
        const elapsed = performance.now() - started;
        expect(res.status).to.equal(200);
        expect(json(res).content[0].text).to.equal(defaultAnswer(messages(m, false)).text);
        expect(elapsed).to.be.at.least(atLeast(HEADERS_MS));
        expect(elapsed).to.be.below(bound(2, 1, HEADERS_MS));
        expect(proxy.stats().forgotten).to.equal(1);
        await proxy.close(); // the forgotten connection's provider side ends only now
        const journal = await calls(2);
        expect(journal).to.have.length(2);
        expectAttempts(await recordOf(m), 'succeeded', ['retried', 'succeeded'], /no response headers in time/);
        report('(5) messages half-open before headers, then success', elapsed, journal.length);
      }));

    it('for every connection (chat, not streamed): each attempt ends at the headers timeout, then 502 upstream_failed', () =>
      withProxy('chat', async (proxy, m) => {
        // New connections are accepted and never heard of again: a dead route to the provider.
        proxy.set({ kind: 'half-open' });
        const limit = bound(MAX_ATTEMPTS, MAX_ATTEMPTS, HEADERS_MS);
        const started = performance.now();
        const res = await post('/chat/completions', chat(m, false), limit);
        const elapsed = performance.now() - started;
        expect(res.status).to.equal(502);
        expect(json(res).error.message).to.equal('The provider sent no response headers in time.');
        expect(elapsed).to.be.at.least(atLeast(MAX_ATTEMPTS * HEADERS_MS));
        expect(elapsed).to.be.below(limit);
        expect(proxy.stats().accepted).to.equal(MAX_ATTEMPTS);
        expect(provider.journal).to.have.length(0);
        expectAttempts(await recordOf(m), 'failed', ['retried', 'retried', 'failed'], /no response headers in time/);
        report('(5) chat half-open for every connection', elapsed, proxy.stats().accepted);
      }));
  });

  const measured = createReport('provider', ['case', 'ended after', 'provider calls (connections, where none reached it)']);
  function report(what: string, elapsed: number, calls: number) {
    measured.add([what, seconds(elapsed), calls]);
  }
  after(() => measured.write());
});
