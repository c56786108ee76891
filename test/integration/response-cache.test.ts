// The opt-in response cache (issue 32): a namespace's cache_ttl_minutes, the X-Sarsen-Cache
// header, answers served byte for byte from a succeeded request's stored answer (JSON) or frames
// (streams) with no provider call, as requests of their own (cached_from), and how the cache
// meets deduplication, failures, retention, caller credentials and the accounts.
import { expect } from 'chai';
import crypto from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { startTestServer, type TestServer } from '../support/server.ts';
import OpenAI from 'openai';
import { startFakeProvider, chatFrames, messagesFrames, responsesFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json, until, socketRequest, requestHead, type RawResponse } from '../support/http.ts';
import { call } from '../support/control-plane.ts';
import { registerSecret } from '../support/log-guard.ts';
import { runRetentionSweep } from '../../src/executor/retention.ts';
import { setSetting } from '../../src/config/settings.ts';
import { recountStorage } from '../../src/db/accounting.ts';

const FEE = 1000;
const chat = (content: string, extra: object = {}) => ({ model: 'gpt-test', messages: [{ role: 'user', content }], ...extra });

describe('response cache', function () {
  this.timeout(120_000);
  let provider: FakeProvider;
  let server: TestServer;
  let t: Tenant;

  const admin = (method: string, path: string, body?: unknown) => call(server.url, method, `/${t.tenancy}/v1${path}`, { token: t.adminToken, body });
  const post = (body: object, opts: { path?: string; headers?: Record<string, string>; tenant?: Tenant } = {}): Promise<RawResponse> => {
    const tenant = opts.tenant ?? t;
    return rawRequest(`${tenant.base}${opts.path ?? '/chat/completions'}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': tenant.key, ...opts.headers },
      body: JSON.stringify(body),
    });
  };
  /** The same submission on a socket of its own: the answer's bytes exactly as they came over it. */
  const postOnSocket = (body: object, headers: [string, string][] = []) => {
    const text = Buffer.from(JSON.stringify(body));
    const { pathname, host } = new URL(`${t.base}/chat/completions`);
    return socketRequest(
      t.base,
      requestHead('POST', pathname, [['host', host], ['content-type', 'application/json'], ['x-sarsen-key', t.key], ['content-length', String(text.length)], ['connection', 'close'], ...headers]),
      text,
    );
  };
  const listing = async (tenant = t) => json(await rawRequest(`${tenant.base}/requests?limit=200`, { headers: { 'x-sarsen-key': tenant.key } })).data;
  const usage = async () => json(await rawRequest(`${t.base}/usage`, { headers: { 'x-sarsen-key': t.key } }));
  const newest = async () => (await listing())[0];
  const settled = (id: string) =>
    until(async () => {
      const { rows } = await server.pool.query(`SELECT status FROM sarsen.requests WHERE id = $1`, [id]);
      return rows[0]?.status === 'succeeded' || rows[0]?.status === 'failed' ? rows[0].status : undefined;
    });

  before(async () => {
    provider = await startFakeProvider();
    // The test runs the retention sweep itself; caller-credential backends are allowed.
    server = await startTestServer({ credentialPassthrough: true, settings: { request_fee_micros: FEE, retention_sweep_interval_ms: 86_400_000, retry_base_ms: 10, retry_max_ms: 20 } });
    t = await provision(server, provider);
    const on = await admin('PATCH', `/namespaces/${t.namespace}`, { cache_ttl_minutes: 5 });
    expect(on.status).to.equal(200);
    expect(on.body.cache_ttl_minutes).to.equal(5);
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });
  beforeEach(() => provider.reset());

  it('is off unless the namespace sets it: a settled identical body attaches, as deduplication says', async () => {
    const plain = await provision(server, provider);
    const first = await post(chat('no cache here'), { tenant: plain });
    const second = await post(chat('no cache here'), { tenant: plain });
    expect(second.body.equals(first.body)).to.equal(true);
    expect(second.headers['x-sarsen-cached-from']).to.equal(undefined);
    expect(provider.journal).to.have.length(1);
    const rows = await listing(plain);
    expect(rows).to.have.length(1);
    expect(rows[0].cached_from).to.equal(null);
  });

  it('answers a repeated JSON request byte for byte from the stored answer, with no provider call, as a request of its own', async () => {
    // The provider's own spelling, spaces and key order included: what it sent is what comes back.
    const answer = '{ "id": "chatcmpl-cached",  "object": "chat.completion", "created": 1, "model": "fake-model",\n "choices": [{"index": 0, "message": {"role": "assistant", "content": "stored words"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}';
    provider.enqueue({ kind: 'json', body: answer });
    const first = await postOnSocket(chat('cache me'));
    expect(first.status).to.equal(200);
    expect(first.body.toString('utf8')).to.equal(answer);
    const original = await newest();
    const second = await postOnSocket(chat('cache me'));
    expect(second.status).to.equal(200);
    expect(second.body.equals(first.body)).to.equal(true);
    expect(second.headers['content-type']).to.equal(first.headers['content-type']);
    expect(second.headers['x-sarsen-cached-from']).to.equal(original.request_id);
    expect(provider.journal).to.have.length(1);

    // Its own record and listing row: succeeded, marked, tokens reported, cost not charged.
    const copy = await newest();
    expect(copy.request_id).to.not.equal(original.request_id);
    expect(copy).to.include({ status: 'succeeded', cached_from: original.request_id, prompt_tokens: 7, completion_tokens: 3, total_tokens: 10, cost: 0, attempts: 0 });
    expect(original).to.include({ cached_from: null, cost: FEE });
    const record = await rawRequest(`${t.base}/requests/${copy.request_id}`, { headers: { 'x-sarsen-key': t.key } });
    expect(json(record)).to.include({ status: 'succeeded', cached_from: original.request_id });
    expect(record.body.toString('utf8')).to.include(`"response":${answer}`);

    // The ledger says why it cost nothing; usage counts a submission and no provider call.
    const ledger = json(await rawRequest(`${server.url}/${t.tenancy}/v1/billing/ledger`, { headers: { authorization: `Bearer ${t.adminToken}` } })).data;
    const entries = Object.fromEntries(ledger.filter((e: { request_id: string }) => [original.request_id, copy.request_id].includes(e.request_id)).map((e: { request_id: string; kind: string; amount_micros: number }) => [e.request_id, `${e.kind}:${e.amount_micros}`]));
    expect(entries).to.deep.equal({ [original.request_id]: `execution:${FEE}`, [copy.request_id]: 'cached:0' });
    const u = await usage();
    expect(u).to.include({ accepted_submissions: 2, provider_calls: 1, cache_hits: 1 });
    expect(u.api_keys[0]).to.include({ api_key_id: t.apiKeyId, ledger_events: 2, provider_calls: 1, cache_hits: 1, total_tokens: 10 });
    // The copy holds its own answer, counted in storage.
    const storage = json(await rawRequest(`${t.base}/storage`, { headers: { 'x-sarsen-key': t.key } }));
    expect(await recountStorage(server.pool, t.namespaceId)).to.deep.equal({ request_bytes: storage.request_bytes, response_bytes: storage.response_bytes, chunk_bytes: storage.chunk_bytes });
    expect(storage.response_bytes).to.equal(2 * Buffer.byteLength(answer));
  });

  it('replays a repeated stream as its stored frames, byte for byte, with no provider call; POST /requests is answered from the cache too', async () => {
    const frames = chatFrames(['cached ', 'stream'], { usage: true, lineEnding: '\r\n' });
    provider.enqueue({ kind: 'sse', frames, frameDelayMs: 20 });
    const body = chat('stream me', { stream: true, stream_options: { include_usage: true } });
    const first = await post(body);
    expect(first.status).to.equal(200);
    expect(first.body.toString('latin1')).to.equal(frames.join(''));
    const original = await newest();
    const second = await post(body);
    expect(second.status).to.equal(200);
    expect(second.headers['content-type']).to.match(/^text\/event-stream/);
    expect(second.body.equals(first.body)).to.equal(true);
    expect(second.headers['x-sarsen-cached-from']).to.equal(original.request_id);
    const copy = await newest();
    expect(copy).to.include({ cached_from: original.request_id, streaming: true, status: 'succeeded', cost: 0 });
    // Its replay by id is the same frames, each with its id line.
    const replay = await rawRequest(`${t.base}/requests/${copy.request_id}`, { headers: { 'x-sarsen-key': t.key, accept: 'text/event-stream' } });
    expect(replay.body.toString('latin1').replace(/^id: \d+\r?\n/gm, '')).to.equal(frames.join(''));

    const queued = await post(body, { path: '/requests' });
    expect(queued.status).to.equal(202);
    expect(json(queued).status).to.equal('succeeded');
    expect(queued.headers['x-sarsen-cached-from']).to.equal(original.request_id);
    expect(provider.journal).to.have.length(1);
  });

  it('no-store bypasses it: a new provider call even while an answer is cached, and that answer is not kept for later', async () => {
    await post(chat('bypass'));
    const original = await newest();
    const bypass = await post(chat('bypass'), { headers: { 'x-sarsen-cache': 'no-store' } });
    expect(bypass.status).to.equal(200);
    expect(bypass.headers['x-sarsen-cached-from']).to.equal(undefined);
    expect(provider.journal).to.have.length(2);
    const uncached = await newest();
    expect(uncached).to.include({ cached_from: null });
    expect(uncached.request_id).to.not.equal(original.request_id);
    // Later submissions are served the answer that was kept, not the no-store one.
    const later = await post(chat('bypass'));
    expect(later.headers['x-sarsen-cached-from']).to.equal(original.request_id);
    expect(provider.journal).to.have.length(2);
    const bad = await post(chat('bypass'), { headers: { 'x-sarsen-cache': 'max-age=soon' } });
    expect(bad.status).to.equal(400);
    expect(json(bad).error.code).to.equal('bad_request');
  });

  it('expires: past max-age, or past the namespace\'s life, a settled answer is not served and a new call is made', async () => {
    await post(chat('short life'));
    await sleep(1100);
    const fresh = await post(chat('short life'), { headers: { 'x-sarsen-cache': 'max-age=1' } });
    expect(fresh.headers['x-sarsen-cached-from']).to.equal(undefined);
    expect(provider.journal).to.have.length(2);
    // max-age only shortens: with a long one, the newest answer is served.
    const served = await post(chat('short life'), { headers: { 'x-sarsen-cache': 'max-age=86400' } });
    expect(served.headers['x-sarsen-cached-from']).to.be.a('string');
    expect(provider.journal).to.have.length(2);

    await post(chat('namespace life'));
    const old = await newest();
    // Aged past the namespace's five minutes (the clock need not pass).
    await server.pool.query(`UPDATE sarsen.requests SET finished_at = now() - interval '6 minutes' WHERE id = $1`, [old.request_id]);
    const again = await post(chat('namespace life'));
    expect(again.headers['x-sarsen-cached-from']).to.equal(undefined);
    expect(provider.journal).to.have.length(4);
  });

  it('attaches to an identical body in flight, as always; serves nothing from a failure', async () => {
    provider.enqueue({ kind: 'json', body: JSON.stringify({ id: 'slow', object: 'chat.completion', choices: [] }), delayMs: 1500 });
    const a = await post(chat('in flight'), { path: '/requests' });
    const b = await post(chat('in flight'), { path: '/requests' });
    expect(json(b).request_id).to.equal(json(a).request_id);
    expect(b.headers['x-sarsen-cached-from']).to.equal(undefined);
    await settled(json(a).request_id);
    expect(provider.journal).to.have.length(1);

    provider.enqueue({ kind: 'refuse', status: 400, body: { error: { message: 'no' } } });
    expect((await post(chat('fails'))).status).to.equal(400);
    const retried = await post(chat('fails'));
    expect(retried.status).to.equal(200);
    expect(retried.headers['x-sarsen-cached-from']).to.equal(undefined);
    expect(provider.journal).to.have.length(3);
  });

  it('never serves a chat stream the provider ended with an error frame: the same body is called anew, and its whole answer is then served', async () => {
    const frames = [...chatFrames(['half an ']).slice(0, 2), 'data: {"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}\n\n'];
    provider.enqueue({ kind: 'sse', frames });
    const body = chat('stream that errs', { stream: true });
    const first = await post(body);
    expect(first.status).to.equal(200);
    expect(first.body.toString('latin1')).to.equal(frames.join(''));
    const original = await newest();
    // The provider answered 200: the request succeeded, and its frames are its record.
    expect(original).to.include({ status: 'succeeded', cached_from: null });
    const second = await post(body);
    expect(second.status).to.equal(200);
    expect(second.headers['x-sarsen-cached-from']).to.equal(undefined);
    expect(second.body.toString('latin1')).to.not.include('"error"');
    const calls = provider.journal.filter((e) => e.json?.messages?.[0]?.content === 'stream that errs');
    expect(calls).to.have.length(2);
    // The whole answer the second call made is the one served from then on.
    const renewed = await newest();
    const third = await post(body);
    expect(third.headers['x-sarsen-cached-from']).to.equal(renewed.request_id);
    expect(third.body.equals(second.body)).to.equal(true);
    expect(provider.journal.filter((e) => e.json?.messages?.[0]?.content === 'stream that errs')).to.have.length(2);
  });

  it('never serves a stream cut short without its last event (chat [DONE], message_stop), though the provider closed it cleanly', async () => {
    const cases = [
      { path: '/chat/completions', body: chat('stream cut short', { stream: true }), whole: chatFrames(['cut ', 'short']), content: 'stream cut short' },
      {
        path: '/messages',
        body: { model: 'claude-test', max_tokens: 16, messages: [{ role: 'user', content: 'messages cut short' }], stream: true },
        whole: messagesFrames(['cut ', 'short']),
        content: 'messages cut short',
      },
    ];
    for (const c of cases) {
      const cut = c.whole.filter((f) => !f.includes('[DONE]') && !f.includes('message_stop'));
      expect(cut.length, c.path).to.be.below(c.whole.length);
      provider.enqueue({ kind: 'sse', frames: cut });
      const first = await post(c.body, { path: c.path });
      expect(first.body.toString('latin1'), c.path).to.equal(cut.join(''));
      expect(await newest(), c.path).to.include({ status: 'succeeded', cached_from: null });
      // Not served: the provider is called again, and its whole answer is served from then on.
      provider.enqueue({ kind: 'sse', frames: c.whole });
      const second = await post(c.body, { path: c.path });
      expect(second.headers['x-sarsen-cached-from'], c.path).to.equal(undefined);
      expect(second.body.toString('latin1'), c.path).to.equal(c.whole.join(''));
      const renewed = await newest();
      const third = await post(c.body, { path: c.path });
      expect(third.headers['x-sarsen-cached-from'], c.path).to.equal(renewed.request_id);
      expect(third.body.equals(second.body), c.path).to.equal(true);
      const calls = provider.journal.filter((e) => e.json?.messages?.[0]?.content === c.content);
      expect(calls, c.path).to.have.length(2);
    }
  });

  it('never serves a Responses stream that ended with response.failed; one cut short by response.incomplete is an answer, and is served', async () => {
    const failed = responsesFrames(['half'], { end: 'failed' });
    provider.enqueue({ kind: 'sse', frames: failed });
    const body = { model: 'gpt-test', input: 'a response that fails', stream: true };
    const first = await post(body, { path: '/responses' });
    expect(first.status).to.equal(200);
    expect(first.body.toString('latin1')).to.equal(failed.join(''));
    expect(await newest()).to.include({ status: 'succeeded', dialect: 'responses' });
    const second = await post(body, { path: '/responses' });
    expect(second.status).to.equal(200);
    expect(second.headers['x-sarsen-cached-from']).to.equal(undefined);
    expect(second.body.toString('latin1')).to.include('event: response.completed');
    expect(provider.journal.filter((e) => e.json?.input === 'a response that fails')).to.have.length(2);

    const incomplete = responsesFrames(['cut'], { end: 'incomplete' });
    provider.enqueue({ kind: 'sse', frames: incomplete });
    const short = { model: 'gpt-test', input: 'a response cut short', stream: true };
    const cut = await post(short, { path: '/responses' });
    expect(cut.body.toString('latin1')).to.equal(incomplete.join(''));
    const original = await newest();
    const again = await post(short, { path: '/responses' });
    expect(again.headers['x-sarsen-cached-from']).to.equal(original.request_id);
    expect(again.body.equals(cut.body)).to.equal(true);
    expect(provider.journal.filter((e) => e.json?.input === 'a response cut short')).to.have.length(1);
  });

  it('answers the openai SDK\'s responses.create from the cache byte for byte, with no second provider call', async () => {
    // The provider's own spelling, kept to the byte.
    const answer = `{"id": "resp_cached", "object": "response", "created_at": 1, "status": "completed", "error": null,
  "incomplete_details": null, "model": "fake-model", "output": [{"id": "msg_cached", "type": "message", "status": "completed", "role": "assistant",
  "content": [{"type": "output_text", "annotations": [], "text": "stored response"}]}],
  "usage": {"input_tokens": 4, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 6}}`;
    provider.enqueue({ kind: 'json', body: answer });
    const client = new OpenAI({ baseURL: t.base, apiKey: t.key, maxRetries: 0 });
    const body = { model: 'gpt-test', input: 'cache this response' };
    const first = await client.responses.create(body).withResponse();
    expect(first.data.output_text).to.equal('stored response');
    expect(first.response.headers.get('x-sarsen-cached-from')).to.equal(null);
    const original = await newest();
    const second = await client.responses.create(body).asResponse();
    expect(second.status).to.equal(200);
    expect(second.headers.get('x-sarsen-cached-from')).to.equal(original.request_id);
    expect(Buffer.from(await second.arrayBuffer()).toString('utf8')).to.equal(answer);
    const parsed = await client.responses.create(body);
    expect(parsed.output_text).to.equal('stored response');
    expect(provider.journal.filter((e) => e.json?.input === 'cache this response')).to.have.length(1);
    const copy = await newest();
    expect(copy).to.include({ dialect: 'responses', cached_from: original.request_id, status: 'succeeded', total_tokens: 6 });
  });

  it('never serves an answer the retention sweep removed', async () => {
    // Retention shorter than the cache's life: the sweep ends an answer's life in the cache.
    expect((await admin('PATCH', `/namespaces/${t.namespace}`, { retention_minutes: 60, cache_ttl_minutes: 120 })).status).to.equal(200);
    try {
      await post(chat('swept'));
      const original = await newest();
      await server.pool.query(`UPDATE sarsen.requests SET finished_at = now() - interval '90 minutes' WHERE id = $1`, [original.request_id]);
      // Still within the cache's life: served.
      expect((await post(chat('swept'))).headers['x-sarsen-cached-from']).to.equal(original.request_id);
      await runRetentionSweep(server);
      expect((await rawRequest(`${t.base}/requests/${original.request_id}`, { headers: { 'x-sarsen-key': t.key } })).status).to.equal(410);
      const after = await post(chat('swept'));
      expect(after.status).to.equal(200);
      expect(after.headers['x-sarsen-cached-from']).to.equal(undefined);
      expect(provider.journal).to.have.length(2);
    } finally {
      await admin('PATCH', `/namespaces/${t.namespace}`, { retention_minutes: null, cache_ttl_minutes: 5 });
    }
  });

  it('with metering on, an answer from the cache needs no credit: it is no new execution', async () => {
    await post(chat('metered later'));
    await setSetting(server.pool, 'metering_enabled', 'true'); // the tenancy has no credit
    await server.settings.refresh();
    try {
      const cached = await post(chat('metered later'));
      expect(cached.status).to.equal(200);
      expect(cached.headers['x-sarsen-cached-from']).to.be.a('string');
      const fresh = await post(chat('metered, not cached'));
      expect(fresh.status).to.equal(402);
      expect(json(fresh).error.code).to.equal('insufficient_credits');
    } finally {
      await setSetting(server.pool, 'metering_enabled', 'false');
      await server.settings.refresh();
    }
  });

  it('serves a caller-credential request only to the same credential', async () => {
    const b = await admin('POST', `/namespaces/${t.namespace}/backends`, { name: 'byok', kind: 'chat_compat', address: `${provider.url}/v1`, credential_source: 'caller' });
    expect(b.status, b.text).to.equal(201);
    expect((await admin('POST', `/namespaces/${t.namespace}/routing-rules`, { model: 'byok-*', backend_id: b.body.backend_id })).status).to.equal(201);
    const [mine, theirs] = ['mine', 'theirs'].map((label) => {
      const c = `sk-${label}-${crypto.randomBytes(12).toString('hex')}`;
      registerSecret(c);
      return c;
    });
    const byok = { model: 'byok-1', messages: [{ role: 'user', content: 'my own key' }] };
    await post(byok, { headers: { authorization: `Bearer ${mine}` } });
    const other = await post(byok, { headers: { authorization: `Bearer ${theirs}` } });
    expect(other.headers['x-sarsen-cached-from']).to.equal(undefined);
    expect(provider.journal).to.have.length(2);
    const same = await post(byok, { headers: { authorization: `Bearer ${mine}` } });
    expect(same.headers['x-sarsen-cached-from']).to.be.a('string');
    expect(provider.journal).to.have.length(2);
  });
});
