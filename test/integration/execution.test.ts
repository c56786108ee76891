// Durable execution of non-streaming requests (issue 4): the three submission routes, the
// executor, retries, refusals, the synchronous hold and reading a record by id, with the
// official SDKs and raw HTTP against the fake provider.
import { expect } from 'chai';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { testPool } from '../support/db.ts';
import { namespaceTotals } from '../../src/db/accounting.ts';
import { rawRequest, json, until, socketRequest, requestHead } from '../support/http.ts';

const CHAT_BODY = { model: 'gpt-test', messages: [{ role: 'user' as const, content: 'hello' }] };
const MESSAGES_BODY = { model: 'claude-test', max_tokens: 64, messages: [{ role: 'user' as const, content: 'hello' }] };

describe('durable execution (non-streaming)', function () {
  this.timeout(60_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let unique = 0;
  const chat = (extra: object = {}) => ({ ...CHAT_BODY, messages: [{ role: 'user' as const, content: `hello ${++unique}` }], ...extra });

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer({ settings: { retry_base_ms: 50, retry_max_ms: 200 } });
    t = await provision(server, provider);
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });
  beforeEach(() => provider.reset());

  const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
    rawRequest(`${t.base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key, ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body) });

  describe('vendor SDKs, unmodified', () => {
    it('openai completes a chat completion and receives the provider\'s bytes exactly', async () => {
      const exact = '{ "id": "chatcmpl-x",  "object":"chat.completion", "created": 1, "model":"gpt-test", "choices":[{"index":0,"message":{"role":"assistant","content":"exact ✓"},"finish_reason":"stop"}], "usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5} }';
      provider.enqueue({ kind: 'json', body: exact });
      const client = new OpenAI({ baseURL: t.base, apiKey: t.key, maxRetries: 0 });
      const { data, response } = await client.chat.completions.create(chat()).withResponse();
      expect(data.choices[0]!.message.content).to.equal('exact ✓');
      expect(response.status).to.equal(200);
      // And byte for byte over raw HTTP.
      provider.enqueue({ kind: 'json', body: exact });
      const raw = await post('/chat/completions', chat());
      expect(raw.status).to.equal(200);
      expect(raw.body.equals(Buffer.from(exact))).to.equal(true);
    });

    it('@anthropic-ai/sdk completes a message (base address ending at the namespace)', async () => {
      const client = new Anthropic({ baseURL: t.root, apiKey: t.key, maxRetries: 0 });
      const msg = await client.messages.create({ ...MESSAGES_BODY, messages: [{ role: 'user', content: 'sdk hello' }] });
      expect(msg.type).to.equal('message');
      expect(msg.content[0]).to.include({ type: 'text' });
      expect((msg.content[0] as { text: string }).text).to.include('sdk hello');
      const [entry] = provider.journal;
      expect(entry!.path).to.equal('/v1/messages');
      expect(entry!.headers['x-api-key']).to.equal(t.messagesCredential);
      expect(entry!.headers['anthropic-version']).to.equal('2023-06-01');
    });

    it('the openai client also authenticates with X-Sarsen-Key while Authorization carries something else', async () => {
      const client = new OpenAI({ baseURL: t.base, apiKey: 'not-a-sarsen-key', maxRetries: 0, defaultHeaders: { 'x-sarsen-key': t.key } });
      const res = await client.chat.completions.create(chat());
      expect(res.object).to.equal('chat.completion');
    });
  });

  describe('what goes upstream', () => {
    it('sends the canonical body, with only the model rewritten when a rule says so', async () => {
      await t.addRule({ model: 'alias-model', backend: 'chat', rewrite_model: 'real-model' });
      const text = '{"temperature": 1.0, "model": "alias-model",\n "messages": [{"role":"user","content":"b"},{"role":"user","content":"a"}], "big": 12345678901234567890, "a": 1e2}';
      const res = await post('/chat/completions', text);
      expect(res.status).to.equal(200);
      expect(provider.journal[0]!.body.toString()).to.equal(
        '{"a":1e2,"big":12345678901234567890,"messages":[{"content":"b","role":"user"},{"content":"a","role":"user"}],"model":"real-model","temperature":1.0}',
      );
    });

    it('forwards exactly the vendor headers, with Sarsen\'s own credential, version and hop count', async () => {
      const long = 'x'.repeat(4097);
      const res = await rawRequest(`${t.root}/v1/messages`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          authorization: `Bearer ${t.key}`,
          'anthropic-version': '2099-01-01',
          'anthropic-beta': 'tools-2024',
          'anthropic-custom-thing': 'kept',
          'anthropic-too-long': long,
          'anthropic-just-fits': 'y'.repeat(4096),
          'openai-organization': 'org-1',
          'openai-project': 'proj-1',
          'openai-beta': 'assistants=v2',
          'x-stainless-session': 'sess',
          cookie: 'a=b',
          'x-forwarded-for': '10.0.0.1',
          'last-event-id': '3',
          'user-agent': 'test-agent',
        },
        body: JSON.stringify({ ...MESSAGES_BODY, messages: [{ role: 'user', content: 'headers' }] }),
      });
      expect(res.status, res.body.toString()).to.equal(200);
      const h = provider.journal[0]!.headers;
      const names = Object.keys(h).sort();
      expect(names).to.deep.equal(
        ['accept', 'anthropic-beta', 'anthropic-custom-thing', 'anthropic-just-fits', 'anthropic-version', 'connection', 'content-length', 'content-type', 'host', 'openai-beta', 'openai-organization', 'openai-project', 'x-api-key', 'x-sarsen-hops'].sort(),
      );
      expect(h['anthropic-version']).to.equal('2023-06-01');
      expect(h['x-api-key']).to.equal(t.messagesCredential);
      expect(h['x-sarsen-hops']).to.equal('1');
      expect(h['anthropic-beta']).to.equal('tools-2024');
      expect(h['anthropic-just-fits']).to.equal('y'.repeat(4096));
    });

    it('drops a forwarded header whose value holds a control character', async () => {
      // Node's HTTP parser already refuses most control characters; a tab gets through it.
      const res = await rawRequest(`${t.base}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key, 'openai-beta': 'a\tb', 'openai-project': 'p' },
        body: JSON.stringify(chat()),
      });
      expect(res.status).to.equal(200);
      const h = provider.journal[0]!.headers;
      expect(h['openai-beta']).to.equal(undefined);
      expect(h['openai-project']).to.equal('p');
      expect(h.authorization).to.equal(`Bearer ${t.chatCredential}`);
    });

    it('measures a forwarded value in the bytes that arrived, and forwards those bytes', async () => {
      const utf8 = (n: number) => Buffer.from('é'.repeat(n), 'utf8');
      const body = Buffer.from(JSON.stringify(chat()));
      const url = new URL(t.base);
      const head = requestHead('POST', `${url.pathname}/chat/completions`, [
        ['host', url.host],
        ['content-type', 'application/json'],
        ['content-length', String(body.length)],
        ['connection', 'close'],
        ['x-sarsen-key', t.key],
        ['anthropic-beta', utf8(1025)], // 2,050 bytes
        ['anthropic-at-limit', utf8(2048)], // 4,096 bytes
        ['anthropic-over-limit', Buffer.concat([utf8(2048), Buffer.from('x')])], // 4,097 bytes
        ['openai-project', Buffer.from([0x70, 0xff, 0x80, 0x71])], // bytes that are not UTF-8 at all
      ]);
      const res = await socketRequest(t.base, head, body);
      expect(res.status, res.body.toString()).to.equal(200);
      const raw = provider.journal[0]!.rawHeaders;
      const sent = (name: string) => {
        const i = raw.findIndex((h, n) => n % 2 === 0 && h.toLowerCase() === name);
        return i < 0 ? undefined : Buffer.from(raw[i + 1]!, 'latin1'); // node hands bytes over as latin1
      };
      expect(sent('anthropic-beta')).to.deep.equal(utf8(1025));
      expect(sent('anthropic-at-limit')).to.deep.equal(utf8(2048));
      expect(sent('anthropic-over-limit')).to.equal(undefined);
      expect(sent('openai-project')).to.deep.equal(Buffer.from([0x70, 0xff, 0x80, 0x71]));
    });

    it('refuses a submission already at the re-route ceiling with 508 naming the depth', async () => {
      const res = await post('/chat/completions', chat(), { 'x-sarsen-hops': '5' });
      expect(res.status).to.equal(508);
      expect(json(res).error.code).to.equal('loop_detected');
      expect(json(res).error.message).to.include('5');
      const below = await post('/chat/completions', chat(), { 'x-sarsen-hops': '4' });
      expect(below.status).to.equal(200);
      expect(provider.journal[0]!.headers['x-sarsen-hops']).to.equal('5');
    });
  });

  describe('refusals before any record', () => {
    const countRequests = async () => {
      const pool = testPool(server.db.conn);
      try {
        return (await pool.query(`SELECT count(*)::int AS n FROM sarsen.requests`)).rows[0].n as number;
      } finally {
        await pool.end();
      }
    };

    it('a model no rule matches is 404, a declined model 403 naming the rule, another dialect 422; none is recorded', async () => {
      const before = await countRequests();
      const none = await post('/chat/completions', { ...chat(), model: 'unknown-model' });
      expect(none.status).to.equal(404);
      expect(json(none).error.message).to.include('unknown-model');
      const rule = await t.addRule({ model: 'banned-*', action: 'decline' });
      const declined = await post('/chat/completions', { ...chat(), model: 'banned-1' });
      expect(declined.status).to.equal(403);
      expect(json(declined).error.code).to.equal('forbidden');
      expect(json(declined).error.message).to.include(rule);
      const mismatch = await post('/chat/completions', { ...chat(), model: 'claude-test' });
      expect(mismatch.status).to.equal(422);
      expect(json(mismatch).error.code).to.equal('unprocessable_entity');
      const viaRequests = await post('/requests?dialect=messages', { ...chat(), model: 'gpt-test' });
      expect(viaRequests.status).to.equal(422);
      expect(await countRequests()).to.equal(before);
      expect(provider.journal).to.have.length(0);
    });

    it('a body without a string model, a non-object body, and a bad dialect parameter are 400', async () => {
      for (const body of ['[]', '{"model": 5}', '{"messages": []}', '"text"']) {
        const res = await post('/chat/completions', body);
        expect(res.status, body).to.equal(400);
        expect(json(res).error.code).to.equal('bad_request');
      }
      const res = await post('/requests?dialect=completions', chat());
      expect(res.status).to.equal(400);
    });

    it('routes that do not exist answer 404 in the envelope', async () => {
      for (const [method, url] of [
        ['POST', `${t.base}/messages/count_tokens`],
        ['GET', `${t.base}/models`],
        ['HEAD', `${server.url}/api/hello`],
      ] as const) {
        const res = await rawRequest(url, { method, headers: { 'x-sarsen-key': t.key, 'content-type': 'application/json' }, body: method === 'POST' ? '{}' : undefined });
        expect(res.status, url).to.equal(404);
        if (method !== 'HEAD') expect(json(res).error.code).to.equal('not_found');
      }
    });
  });

  describe('outcomes', () => {
    it('passes a refusal through: status, body byte for byte as application/json, retry-after', async () => {
      const refusal = '{"error": {"type":"invalid_request_error","message":"nope"} }';
      provider.enqueue({ kind: 'refuse', status: 400, body: refusal, retryAfter: '17' });
      const res = await post('/chat/completions', chat());
      expect(res.status).to.equal(400);
      expect(res.headers['content-type']).to.match(/^application\/json/);
      expect(res.headers['retry-after']).to.equal('17');
      expect(res.body.toString()).to.equal(refusal);
    });

    it('a terminal failure releases the claim: the same body runs again, a second provider call', async () => {
      const body = chat();
      provider.enqueue({ kind: 'refuse', status: 422, body: { error: 'first' } });
      expect((await post('/chat/completions', body)).status).to.equal(422);
      const again = await post('/chat/completions', body);
      expect(again.status).to.equal(200);
      expect(provider.journal).to.have.length(2);
    });

    it('retries a retryable answer, honouring retry-after, then succeeds', async () => {
      provider.enqueue({ kind: 'refuse', status: 429, retryAfter: '1' }, { kind: 'refuse', status: 503 });
      const started = Date.now();
      const res = await post('/chat/completions', chat());
      expect(res.status).to.equal(200);
      expect(provider.journal).to.have.length(3);
      // retry-after: 1 second separates the first two calls (the backoff alone is 50-200 ms).
      expect(provider.journal[1]!.receivedAt - provider.journal[0]!.receivedAt).to.be.at.least(950);
      expect(Date.now() - started).to.be.at.least(950);
    });

    it('fails with the last answer once the attempts are used up, and says so on the record', async () => {
      provider.enqueue({ kind: 'refuse', status: 503, body: '{"e":1}' }, { kind: 'refuse', status: 503, body: '{"e":2}' }, { kind: 'refuse', status: 503, body: '{"e":3}', retryAfter: 'Wed, 21 Oct 2015 07:28:00 GMT' });
      const res = await post('/requests', chat());
      expect(res.status).to.equal(202);
      const id = json(res).request_id as string;
      const record = await until(async () => {
        const r = await rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key } });
        const j = json(r);
        return j.status === 'failed' ? { r, j } : undefined;
      });
      const { attempt_log: log, ...fields } = record.j;
      expect(fields).to.deep.equal({
        request_id: id, status: 'failed', dialect: 'chat', streaming: false, backend_id: t.backends.chat, attempts: 3, recoveries: 0, next_retry_at: null,
        error: { e: 3 }, error_status: 503, retry_after: 'Wed, 21 Oct 2015 07:28:00 GMT',
      });
      expect(log.map((e: any) => [e.outcome, e.status])).to.deep.equal([['retried', 503], ['retried', 503], ['failed', 503]]);
      expect(record.r.body.toString()).to.include('"error":{"e":3}');
    });

    it('a refusal without retry-after has error_status and no retry_after on the record (never null)', async () => {
      provider.enqueue({ kind: 'refuse', status: 409, body: '{"e":"no retry-after"}' });
      expect((await post('/chat/completions', chat())).status).to.equal(409);
      const rec = json(await rawRequest(`${t.base}/requests/${await lastRequest()}`, { headers: { 'x-sarsen-key': t.key } }));
      const { attempt_log: _log, ...fields } = rec;
      expect(fields).to.deep.equal({
        request_id: rec.request_id, status: 'failed', dialect: 'chat', streaming: false, backend_id: t.backends.chat, attempts: 1, recoveries: 0, next_retry_at: null,
        error: { e: 'no retry-after' }, error_status: 409,
      });
    });

    it('a refusal that is not JSON passes through byte for byte, and the record wraps it beside its content type', async () => {
      const page = '<html><body><h1>403 Forbidden</h1>\n</body></html>';
      provider.enqueue({ kind: 'refuse', status: 403, body: page, headers: { 'content-type': 'text/html; charset=utf-8' } });
      const res = await post('/chat/completions', chat());
      expect(res.status).to.equal(403);
      expect(res.headers['content-type']).to.match(/^application\/json/);
      expect(res.body.toString()).to.equal(page);
      const rec = json(await rawRequest(`${t.base}/requests/${await lastRequest()}`, { headers: { 'x-sarsen-key': t.key } }));
      expect(rec.error).to.deep.equal({ body: page, content_type: 'text/html; charset=utf-8' });
      expect(rec.error_status).to.equal(403);
    });

    it('a transport failure is 502 upstream_failed, stored without error_status or retry_after', async () => {
      provider.enqueue({ kind: 'drop' }, { kind: 'drop' }, { kind: 'drop' });
      const res = await post('/chat/completions', chat());
      expect(res.status).to.equal(502);
      expect(json(res).error.code).to.equal('upstream_failed');
      expect(json(res).error.message).to.match(/provider/i);
      const list = await lastRequest();
      const rec = json(await rawRequest(`${t.base}/requests/${list}`, { headers: { 'x-sarsen-key': t.key } }));
      expect(rec.status).to.equal('failed');
      expect(rec.error.error.code).to.equal('upstream_failed');
      expect(rec).to.not.have.property('error_status');
      expect(rec).to.not.have.property('retry_after');
      expect(rec).to.not.have.property('response');
    });
  });

  async function lastRequest(): Promise<string> {
    const pool = testPool(server.db.conn);
    try {
      return (await pool.query(`SELECT id FROM sarsen.requests ORDER BY id DESC LIMIT 1`)).rows[0].id;
    } finally {
      await pool.end();
    }
  }

  describe('records and attaching', () => {
    it('POST /requests answers 202 at once; the record carries the stored answer exactly', async () => {
      const exact = '{"id":"x","object":"chat.completion","choices":[],  "usage":{"prompt_tokens":1,"completion_tokens":0,"total_tokens":1}}';
      provider.enqueue({ kind: 'json', body: exact, delayMs: 300 });
      const res = await post('/requests', chat());
      expect(res.status).to.equal(202);
      const body = json(res);
      expect(Object.keys(body)).to.deep.equal(['request_id', 'status']);
      expect(body.status).to.equal('pending');
      expect(body.request_id).to.match(/^req_[0-9A-HJKMNP-TV-Z]{26}$/);
      const pending = json(await rawRequest(`${t.base}/requests/${body.request_id}`, { headers: { 'x-sarsen-key': t.key } }));
      expect(pending).to.not.have.property('response');
      expect(pending).to.not.have.property('error');
      const done = await until(async () => {
        const r = await rawRequest(`${t.base}/requests/${body.request_id}`, { headers: { authorization: `Bearer ${t.key}` } });
        return json(r).status === 'succeeded' ? r : undefined;
      });
      // The stored answer is embedded byte for byte, after the record's own fields.
      const text = done.body.toString();
      expect(text.startsWith(`{"request_id":"${body.request_id}","status":"succeeded","dialect":"chat","streaming":false,"backend_id":"${t.backends.chat}","attempts":1,"recoveries":0,"next_retry_at":null,"attempt_log":[`)).to.equal(true);
      expect(text.endsWith(`,"response":${exact}}`)).to.equal(true);
    });

    it('an unknown id, and another namespace\'s id, are 404', async () => {
      const res = await rawRequest(`${t.base}/requests/req_01ARZ3NDEKTSV4RRFFQ69G5FAV`, { headers: { 'x-sarsen-key': t.key } });
      expect(res.status).to.equal(404);
      const other = await provision(server, provider, { namespace: 'other' });
      const mine = json(await post('/requests', chat())).request_id;
      const theirs = await rawRequest(`${other.base}/requests/${mine}`, { headers: { 'x-sarsen-key': other.key } });
      expect(theirs.status).to.equal(404);
      expect(json(theirs).error.code).to.equal('not_found');
      // Let the fire-and-forget execution finish inside this test, not the next one.
      await until(async () => (json(await rawRequest(`${t.base}/requests/${mine}`, { headers: { 'x-sarsen-key': t.key } })).status === 'succeeded' ? true : undefined));
    });

    it('the same body in two namespaces is two requests', async () => {
      const other = await provision(server, provider, { namespace: `ns-two` });
      const body = chat();
      expect((await post('/chat/completions', body)).status).to.equal(200);
      const res = await rawRequest(`${other.base}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': other.key }, body: JSON.stringify(body) });
      expect(res.status).to.equal(200);
      expect(provider.journal).to.have.length(2);
    });

    it('attaches an identical body while running (holds, same answer) and after success (stored answer): one provider call', async () => {
      provider.enqueue({ kind: 'default', delayMs: 500 });
      const body = chat();
      const reordered = JSON.stringify(Object.fromEntries(Object.entries(body).reverse()), null, 2); // same canonical body
      const [a, b] = await Promise.all([post('/chat/completions', body), new Promise((r) => setTimeout(r, 100)).then(() => post('/chat/completions', reordered))]);
      expect(a.status).to.equal(200);
      expect(b.body.equals(a.body)).to.equal(true);
      const c = await post('/requests?dialect=chat', body);
      expect(json(c).status).to.equal('succeeded');
      const d = await post('/chat/completions', body);
      expect(d.body.equals(a.body)).to.equal(true);
      expect(provider.journal).to.have.length(1);
    });

    it('dozens of concurrent identical submissions make one request row and one provider call', async () => {
      provider.enqueue({ kind: 'default', delayMs: 200 });
      const body = chat();
      const answers = await Promise.all(Array.from({ length: 40 }, () => post('/chat/completions', body)));
      for (const a of answers) {
        expect(a.status).to.equal(200);
        expect(a.body.equals(answers[0]!.body)).to.equal(true);
      }
      expect(provider.journal).to.have.length(1);
      const pool = testPool(server.db.conn);
      try {
        const rows = await pool.query(`SELECT count(*)::int AS n FROM sarsen.requests q JOIN sarsen.request_bodies b ON b.request_id = q.id WHERE b.body LIKE $1`, [`%${(body.messages[0] as { content: string }).content}"%`]);
        expect(rows.rows[0].n).to.equal(1);
        const usage = await namespaceTotals(pool, t.namespaceId);
        expect(Number(usage.accepted_submissions) - Number(usage.provider_calls)).to.be.at.least(39);
      } finally {
        await pool.end();
      }
    });

    it('504 held_too_long carries the request id; the identical body then attaches without a second call', async () => {
      const slow = await startTestServer({ settings: { synchronous_hold_ms: 300 } });
      try {
        const s = await provision(slow, provider);
        provider.enqueue({ kind: 'default', delayMs: 1200 });
        const body = chat();
        const send = () => rawRequest(`${s.base}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': s.key }, body: JSON.stringify(body) });
        const first = await send();
        expect(first.status).to.equal(504);
        expect(json(first).error.code).to.equal('held_too_long');
        const id = /req_[0-9A-Z]{26}/.exec(json(first).error.message)?.[0];
        expect(id).to.be.a('string');
        const done = await until(async () => {
          const r = await send();
          return r.status === 200 ? r : undefined;
        });
        expect(json(done).object).to.equal('chat.completion');
        expect(provider.journal).to.have.length(1);
        const rec = json(await rawRequest(`${s.base}/requests/${id}`, { headers: { 'x-sarsen-key': s.key } }));
        expect(rec.status).to.equal('succeeded');
      } finally {
        await slow.close();
      }
    });

    it('a caller that disconnects mid-hold changes nothing upstream: the record still succeeds', async () => {
      provider.enqueue({ kind: 'default', delayMs: 600 });
      const controller = new AbortController();
      const pending = fetch(`${t.base}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
        body: JSON.stringify(chat()),
        signal: controller.signal,
      }).catch((err: Error) => err);
      await provider.waitForRequests(1);
      controller.abort();
      expect(await pending).to.be.instanceOf(Error);
      const id = await lastRequest();
      const rec = await until(async () => {
        const r = json(await rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key } }));
        return r.status === 'succeeded' ? r : undefined;
      });
      expect(rec.response.object).to.equal('chat.completion');
      expect(provider.journal[0]!.clientAborted).to.equal(false);
    });
  });
});
