// The responses dialect (issue 31) over real HTTP: the official openai client's
// responses.create and responses.stream through Sarsen, the provider's events stored byte for
// byte and replayed by id, identical bodies attached to one execution, tokens counted into the
// record, usage and the ledger, and the rules every dialect follows (refusals, retries, the
// hold, the dialect mismatch, the listing filter, routes that do not exist).
import { expect } from 'chai';
import OpenAI from 'openai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, responsesFrames, defaultAnswer, splitText, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json, until } from '../support/http.ts';
import { call } from '../support/control-plane.ts';
import { setPrice } from '../../src/db/accounting.ts';
import { postStream, replayStream, withIds, bytesOf, requestIdByMarker } from './streaming-support.ts';

describe('the responses dialect', function () {
  this.timeout(60_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let unique = 0;
  const marker = () => `responses-${process.pid}-${++unique}`;

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

  const headers = () => ({ 'content-type': 'application/json', 'x-sarsen-key': t.key });
  const post = (path: string, body: unknown) => rawRequest(`${t.base}${path}`, { method: 'POST', headers: headers(), body: typeof body === 'string' ? body : JSON.stringify(body) });
  const record = async (id: string) => json(await rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key } }));
  const row = async (id: string) => json(await rawRequest(`${t.base}/requests/${id}/summary`, { headers: { 'x-sarsen-key': t.key } }));
  const client = () => new OpenAI({ baseURL: t.base, apiKey: t.key, maxRetries: 0 });

  describe('the openai client, unmodified', () => {
    it('responses.create: the provider is called at {address}/responses with the backend\'s key; the record holds the answer verbatim', async () => {
      const m = marker();
      const body = { model: 'gpt-test', instructions: 'answer briefly', input: m };
      const expected = defaultAnswer(body);
      const answer = await client().responses.create(body);
      expect(answer.output_text).to.equal(expected.text);
      expect(answer.usage).to.include({ input_tokens: expected.promptTokens, output_tokens: expected.completionTokens });
      const [entry] = provider.journal;
      expect(entry!.path).to.equal('/v1/responses');
      expect(entry!.headers.authorization).to.equal(`Bearer ${t.chatCredential}`);
      expect(entry!.headers['x-api-key']).to.equal(undefined);

      const id = await requestIdByMarker(server.db, m);
      const rec = await record(id);
      expect(rec).to.include({ status: 'succeeded', dialect: 'responses', streaming: false, backend_id: t.backends.chat, attempts: 1 });
      expect(rec.response.id).to.equal(answer.id);
      expect(rec.response.object).to.equal('response');
      expect(await row(id)).to.include({
        dialect: 'responses', model: 'gpt-test',
        prompt_tokens: expected.promptTokens, completion_tokens: expected.completionTokens, total_tokens: expected.promptTokens + expected.completionTokens,
      });
    });

    it('responses.stream: the events arrive as the provider sent them; replay by id is byte-exact and resumes after Last-Event-ID', async () => {
      const m = marker();
      const body = { model: 'gpt-test', input: [{ role: 'user' as const, content: m }] };
      const expected = defaultAnswer(body);
      // The provider's bytes, kept here so the replay is compared with what was sent, not with itself.
      const sent = responsesFrames(splitText(expected.text, 4), { id: `resp_${m}`, model: 'gpt-test', inputTokens: expected.promptTokens, outputTokens: expected.completionTokens });
      provider.enqueue({ kind: 'sse', frames: sent });
      const stream = client().responses.stream(body);
      const deltas: string[] = [];
      const types: string[] = [];
      stream.on('event', (e) => types.push(e.type));
      stream.on('response.output_text.delta', (e) => deltas.push(e.delta));
      const final = await stream.finalResponse();
      expect(deltas.join('')).to.equal(expected.text);
      expect(final.output_text).to.equal(expected.text);
      expect(types[0]).to.equal('response.created');
      expect(types.at(-1)).to.equal('response.completed');
      expect(types).to.have.length(sent.length);

      const id = await requestIdByMarker(server.db, m);
      const rec = await record(id);
      expect(rec).to.include({ status: 'succeeded', dialect: 'responses', streaming: true });
      expect(rec).to.not.have.property('response');
      const replay = await replayStream(t, id).done;
      expect(replay.headers['content-type']).to.match(/^text\/event-stream/);
      expect(replay.body.equals(withIds(sent)), replay.body.toString('latin1')).to.equal(true);
      const resumed = await replayStream(t, id, 3).done;
      expect(resumed.body.equals(withIds(sent.slice(3), 4))).to.equal(true);
    });
  });

  it('a raw caller receives exactly the provider\'s bytes, whatever the line endings; a failed response\'s events pass unchanged', async () => {
    for (const [lineEnding, end] of [['\r\n', 'completed'], ['\r', 'incomplete'], ['\n', 'failed']] as const) {
      const frames = responsesFrames(['Hel', 'lo'], { lineEnding, end, inputTokens: 3, outputTokens: 2 });
      provider.enqueue({ kind: 'sse', frames, frameDelayMs: 2 });
      const m = marker();
      const live = await postStream(t, '/responses', { model: 'gpt-test', stream: true, input: m }).done;
      expect(live.status).to.equal(200);
      expect(live.body.equals(bytesOf(frames)), `${end}: ${live.body.toString('latin1')}`).to.equal(true);
      const id = await requestIdByMarker(server.db, m);
      // The provider said how the response ended; Sarsen stored what it streamed and counts its tokens.
      expect(await row(id)).to.include({ status: 'succeeded', prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 });
      expect((await replayStream(t, id).done).body.equals(withIds(frames))).to.equal(true);
    }
  });

  it('identical bodies sent concurrently make one provider call, streamed or not, and every caller gets the same bytes', async () => {
    provider.rule(() => ({ kind: 'default', delayMs: 400, frameDelayMs: 20 }));
    for (const stream of [false, true]) {
      const body = JSON.stringify({ model: 'gpt-test', stream, input: marker(), store: false });
      const answers = await Promise.all(Array.from({ length: 5 }, () => post('/responses', body)));
      expect(answers.map((a) => a.status)).to.deep.equal([200, 200, 200, 200, 200]);
      for (const a of answers) expect(a.body.equals(answers[0]!.body)).to.equal(true);
      if (stream) expect(answers[0]!.body.toString()).to.match(/^event: response\.created\n/);
      else expect(json(answers[0]!).object).to.equal('response');
    }
    expect(provider.journal.map((e) => e.path)).to.deep.equal(['/v1/responses', '/v1/responses']);
    // The same body on the fire-and-forget route attaches too.
    const body = { model: 'gpt-test', input: marker() };
    const sync = await post('/responses', body);
    const accepted = json(await post('/requests?dialect=responses', body));
    expect((await record(accepted.request_id)).response).to.deep.equal(json(sync));
    expect(provider.journal).to.have.length(3);
  });

  it('tokens of a streamed call reach the record, usage and the ledger', async () => {
    await setPrice(server.pool, 'gpt-priced', 1_000_000, 2_000_000); // one micro-credit a prompt token, two a completion token
    const usageBefore = json(await rawRequest(`${t.base}/usage`, { headers: { 'x-sarsen-key': t.key } })).api_keys[0];
    provider.enqueue({ kind: 'sse', frames: responsesFrames(['a ', 'b ', 'c'], { inputTokens: 40, outputTokens: 3 }) });
    const m = marker();
    const live = await postStream(t, '/responses', { model: 'gpt-priced', stream: true, input: m }).done;
    expect(live.status).to.equal(200);
    const id = await requestIdByMarker(server.db, m);
    expect(await row(id)).to.include({ prompt_tokens: 40, completion_tokens: 3, total_tokens: 43, cost: 40 + 2 * 3 });
    const { rows } = await server.pool.query(`SELECT kind, amount_micros::int AS amount FROM sarsen.ledger WHERE request_id = $1 AND kind = 'tokens'`, [id]);
    expect(rows).to.deep.equal([{ kind: 'tokens', amount: 40 + 2 * 3 }]);
    const usageAfter = json(await rawRequest(`${t.base}/usage`, { headers: { 'x-sarsen-key': t.key } })).api_keys[0];
    expect(usageAfter.prompt_tokens - (usageBefore?.prompt_tokens ?? 0)).to.equal(40);
    expect(usageAfter.completion_tokens - (usageBefore?.completion_tokens ?? 0)).to.equal(3);
    expect(usageAfter.total_tokens - (usageBefore?.total_tokens ?? 0)).to.equal(43);
  });

  it('store and previous_response_id reach the provider untouched, in the canonical body that is stored; background is stored and never sent (docs/api.md "Background responses")', async () => {
    const m = marker();
    const sent = `{"previous_response_id":"resp_earlier","store":true,"model":"gpt-test","background":false,"input":"${m}","metadata":{"b":1.0,"a":"x"}}`;
    const res = await post('/responses', sent);
    expect(res.status).to.equal(200);
    const upstream = provider.journal[0]!.body.toString();
    expect(upstream).to.equal(`{"input":"${m}","metadata":{"a":"x","b":1.0},"model":"gpt-test","previous_response_id":"resp_earlier","store":true}`);
    const id = await requestIdByMarker(server.db, m);
    const stored = await rawRequestBody(id);
    expect(stored).to.equal(`{"background":false,"input":"${m}","metadata":{"a":"x","b":1.0},"model":"gpt-test","previous_response_id":"resp_earlier","store":true}`);
  });

  const rawRequestBody = async (id: string): Promise<string> => {
    const { rows } = await server.pool.query(`SELECT body FROM sarsen.request_bodies WHERE request_id = $1`, [id]);
    return rows[0].body;
  };

  it('a refusal passes through verbatim; a retryable answer is retried', async () => {
    const refusal = '{ "error": {"message":"previous response not found","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"} }';
    provider.enqueue({ kind: 'refuse', status: 400, body: refusal, retryAfter: '3' });
    const refused = await post('/responses', { model: 'gpt-test', input: marker(), previous_response_id: 'resp_gone' });
    expect(refused.status).to.equal(400);
    expect(refused.body.toString()).to.equal(refusal);
    expect(refused.headers['retry-after']).to.equal('3');

    provider.enqueue({ kind: 'refuse', status: 503 });
    const m = marker();
    const retried = await post('/responses', { model: 'gpt-test', input: m });
    expect(retried.status).to.equal(200);
    expect(json(retried).output[0].content[0].text).to.equal(defaultAnswer({ input: m }).text);
    const rec = await record(await requestIdByMarker(server.db, m));
    expect(rec.attempt_log.map((e: any) => [e.outcome, e.status])).to.deep.equal([['retried', 503], ['succeeded', 200]]);
  });

  it('a model whose rule names a messages backend is 422 on /responses and on /requests?dialect=responses, and writes no record', async () => {
    const before = (await server.pool.query(`SELECT count(*)::int AS n FROM sarsen.requests`)).rows[0].n;
    for (const path of ['/responses', '/requests?dialect=responses']) {
      const res = await post(path, { model: 'claude-test', input: 'hi' });
      expect(res.status, path).to.equal(422);
      expect(json(res).error.code).to.equal('unprocessable_entity');
      expect(json(res).error.message).to.include('messages-dialect backend');
    }
    // And the other way round, as ever: a chat backend does not serve the messages route.
    expect((await post('/messages', { model: 'gpt-test', max_tokens: 5, messages: [] })).status).to.equal(422);
    expect((await server.pool.query(`SELECT count(*)::int AS n FROM sarsen.requests`)).rows[0].n).to.equal(before);
    expect(provider.journal).to.have.length(0);
  });

  it('the listing filters by dialect, by key and by session', async () => {
    await post('/chat/completions', { model: 'gpt-test', messages: [{ role: 'user', content: marker() }] });
    await post('/responses', { model: 'gpt-test', input: marker() });
    const list = async (q: string) => json(await rawRequest(`${t.base}/requests?${q}`, { headers: { 'x-sarsen-key': t.key } }));
    const responses = (await list('dialect=responses&limit=200')).data;
    const chats = (await list('dialect=chat&limit=200')).data;
    expect(responses.length).to.be.greaterThan(0);
    expect(chats.length).to.be.greaterThan(0);
    expect(responses.every((r: any) => r.dialect === 'responses')).to.equal(true);
    expect(chats.every((r: any) => r.dialect === 'chat')).to.equal(true);
    const bySession = await call(server.url, 'GET', `/${t.tenancy}/v1/namespaces/${t.namespace}/requests?dialect=responses&limit=200`, { token: t.adminToken });
    expect(bySession.body.data).to.deep.equal(responses);
    const bad = await rawRequest(`${t.base}/requests?dialect=completions`, { headers: { 'x-sarsen-key': t.key } });
    expect(bad.status).to.equal(400);
  });

  it('routes Sarsen does not serve are 404, and the message names the routes it does serve', async () => {
    for (const [method, path] of [
      ['POST', '/embeddings'], ['GET', '/models'], ['POST', '/messages/count_tokens'], ['POST', '/responses/input_tokens'], ['POST', '/v1/messages'],
    ] as const) {
      const res = await rawRequest(`${t.base}${path}`, { method, headers: headers(), body: method === 'GET' ? undefined : '{}' });
      expect(res.status, `${method} ${path}`).to.equal(404);
      const { error } = json(res);
      expect(error.code).to.equal('not_found');
      expect(error.message).to.include(`No route for ${method} /${t.tenancy}/${t.namespace}/v1${path}.`);
      expect(error.message).to.include('POST /chat/completions, POST /messages, POST /responses');
    }
    expect(provider.journal).to.have.length(0);
  });

  it('a synchronous hold past synchronous_hold_ms is 504 with the id; the identical body then attaches without a second call', async () => {
    const slow = await startTestServer({ settings: { synchronous_hold_ms: 300 } });
    try {
      const s = await provision(slow, provider);
      provider.enqueue({ kind: 'default', delayMs: 1200 });
      const body = JSON.stringify({ model: 'gpt-test', stream: true, input: marker() });
      const send = () => rawRequest(`${s.base}/responses`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': s.key }, body });
      const first = await send();
      expect(first.status).to.equal(504);
      expect(json(first).error.code).to.equal('held_too_long');
      const id = /req_[0-9A-Z]{26}/.exec(json(first).error.message)![0];
      const done = await until(async () => {
        const r = await send();
        return r.status === 200 ? r : undefined;
      });
      expect(done.body.toString()).to.match(/event: response\.completed\n/);
      expect(provider.journal).to.have.length(1);
      expect(json(await rawRequest(`${s.base}/requests/${id}`, { headers: { 'x-sarsen-key': s.key } }))).to.include({ status: 'succeeded', dialect: 'responses' });
    } finally {
      await slow.close();
    }
  });
});
