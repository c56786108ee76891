// Background responses (issue 42) over real HTTP with the unmodified openai SDK: Sarsen performs
// the vendor's background mode itself (docs/api.md "Background responses"). Create answers at
// once; retrieve, resume by starting_after, cancel, delete and input items read what Sarsen
// stored, by Sarsen's id or the provider's resp_ id; errors are the vendor's shape.
import { expect } from 'chai';
import OpenAI, { NotFoundError, BadRequestError, APIError } from 'openai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, responsesFrames, responsesBody, type FakeProvider, type JournalEntry } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json, until } from '../support/http.ts';
import { gate, query } from './streaming-support.ts';

/** The vendor's frames without their sequence_number: a server that numbers no events. */
const unnumbered = (frames: string[]) => frames.map((f) => f.replace(/,"sequence_number":\d+/, ''));

describe('background responses', function () {
  this.timeout(60_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let other: Tenant;
  let unique = 0;
  const marker = () => `background-${process.pid}-${++unique}`;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer({ settings: { retry_base_ms: 50, retry_max_ms: 200 } });
    t = await provision(server, provider);
    other = await provision(server, provider, { namespace: 'elsewhere' });
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });
  beforeEach(() => provider.reset());

  const client = (tenant = t) => new OpenAI({ baseURL: tenant.base, apiKey: tenant.key, maxRetries: 0 });
  const calls = () => provider.journal.filter((e) => e.path === '/v1/responses');
  const get = (path: string) => rawRequest(`${t.base}${path}`, { headers: { 'x-sarsen-key': t.key } });
  const noBackground = (e: JournalEntry) => expect(e.json, 'the body sent upstream').to.not.have.property('background');

  // The provider answers a background body (the vendor's queued placeholder, see the fake
  // provider) or refuses it (a server with no background mode): Sarsen sends neither.
  for (const provider_ of ['with background mode of its own', 'with no background mode'] as const) {
    describe(`a provider ${provider_}`, () => {
      let undo: (() => void) | null = null;
      beforeEach(() => {
        if (provider_ === 'with no background mode') {
          undo = provider.rule((e) => (e.json?.background !== undefined ? { kind: 'refuse', status: 400, body: { error: { message: "Unknown parameter: 'background'.", type: 'invalid_request_error', param: 'background', code: 'unknown_parameter' } } } : undefined));
        }
      });
      afterEach(() => undo?.());

      it('create answers queued or in_progress before a slow provider answers; retrieve later gives the provider\'s response byte for byte', async () => {
        const release = gate();
        let released = false;
        const open = () => {
          released = true;
          release.open();
        };
        const answer = responsesBody('the slow answer', { id: 'resp_slow_1', messageId: 'msg_slow_1' });
        provider.enqueue({ kind: 'json', body: answer, after: release.until });
        const m = marker();
        // The provider answers only once the create returned, or after this: a create that waits
        // for the answer then fails the assertions below instead of the test's timeout. Far above
        // what a create takes, even on a loaded machine.
        const fallback = setTimeout(open, 10_000);
        const created = await client().responses.create({ model: 'gpt-test', input: m, background: true, metadata: { m } }).finally(() => clearTimeout(fallback));
        // The create did not wait for the provider: it returned while the provider still held its answer.
        expect(released, 'the provider was let answer before the create returned').to.equal(false);
        expect(created.object).to.equal('response');
        expect(['queued', 'in_progress']).to.include(created.status);
        expect(created).to.include({ background: true, model: 'gpt-test' });
        expect(created.output).to.deep.equal([]);
        expect(created.metadata).to.deep.equal({ m });
        // Sarsen's id spelled the vendor's way: resp_ for the request's req_.
        expect(created.id).to.match(/^resp_[0-9A-Z]{26}/);
        const requestId = created.id.replace(/^resp_/, 'req_');
        const record = json(await get(`/requests/${requestId}`));
        expect(record).to.include({ request_id: requestId, dialect: 'responses' });
        expect(record.status, 'the request while the provider holds its answer').to.be.oneOf(['pending', 'running']);
        expect((await client().responses.retrieve(created.id)).status).to.be.oneOf(['queued', 'in_progress']);

        open();
        const done = await until(async () => {
          const r = await client().responses.retrieve(created.id);
          return r.status === 'completed' ? r : undefined;
        });
        expect(done.output_text).to.equal('the slow answer');
        const raw = await get(`/responses/${created.id}`);
        expect(raw.body.toString()).to.equal(JSON.stringify(answer));
        // By the request id too.
        expect((await get(`/responses/${requestId}`)).body.toString()).to.equal(JSON.stringify(answer));
        // By the provider's id too.
        expect((await get(`/responses/resp_slow_1`)).body.toString()).to.equal(JSON.stringify(answer));
        expect(calls()).to.have.length(1);
        noBackground(calls()[0]!);
      });

      it('a background stream read in part and dropped, resumed with starting_after, gives every remaining event once and the text whole', async () => {
        const pieces = Array.from({ length: 12 }, (_, i) => `part${i} `);
        const frames = responsesFrames(pieces, { id: 'resp_stream_1', messageId: 'msg_stream_1' });
        const half = gate();
        provider.enqueue({ kind: 'sse', frames, waitBefore: { 8: half.until } });
        const stream = await client().responses.create({ model: 'gpt-test', input: marker(), background: true, stream: true });
        const seen: { seq: number; type: string; delta?: string; id?: string }[] = [];
        for await (const ev of stream) {
          seen.push({ seq: ev.sequence_number, type: ev.type, delta: ev.type === 'response.output_text.delta' ? ev.delta : undefined, id: ev.type === 'response.created' ? ev.response.id : undefined });
          if (ev.sequence_number === 5) break; // the caller goes away
        }
        half.open();
        const id = seen[0]!.id!;
        expect(id).to.equal('resp_stream_1');
        const resumed = await client().responses.retrieve(id, { stream: true, starting_after: 5 });
        const rest: typeof seen = [];
        for await (const ev of resumed) rest.push({ seq: ev.sequence_number, type: ev.type, delta: ev.type === 'response.output_text.delta' ? ev.delta : undefined });
        const all = [...seen, ...rest];
        expect(all.map((e) => e.seq)).to.deep.equal(frames.map((_, i) => i));
        expect(all.map((e) => e.delta ?? '').join('')).to.equal(pieces.join(''));
        expect(rest.at(-1)!.type).to.equal('response.completed');
        // Retrieve: the terminal event's response, byte for byte.
        const terminal = JSON.parse(frames.at(-1)!.split('data: ')[1]!);
        expect((await get(`/responses/${id}`)).body.toString()).to.equal(JSON.stringify(terminal.response));
        // From the first event without starting_after, the stored bytes exactly.
        const whole = await rawRequest(`${t.base}/responses/${id}?stream=true`, { headers: { 'x-sarsen-key': t.key } });
        expect(whole.body.toString()).to.equal(frames.join(''));
        expect(calls()).to.have.length(1);
        noBackground(calls()[0]!);
      });
    });
  }

  it('a provider that numbers no events: starting_after counts the stored events of the attempt from 0; dropped and resumed, the text joins whole', async () => {
    const pieces = ['alpha ', 'beta ', 'gamma ', 'delta ', 'epsilon ', 'zeta '];
    const frames = unnumbered(responsesFrames(pieces, { id: 'resp_unnumbered' }));
    expect(frames.join('')).to.not.include('sequence_number');
    const half = gate();
    provider.enqueue({ kind: 'sse', frames, waitBefore: { 7: half.until } });
    const stream = await client().responses.create({ model: 'gpt-test', input: marker(), background: true, stream: true });
    // The caller counts the events itself, as the provider numbers none.
    const texts: string[] = [];
    let read = 0;
    for await (const ev of stream) {
      read++;
      if (ev.type === 'response.output_text.delta') texts.push(ev.delta);
      if (read === 6) break;
    }
    half.open();
    const resumed = await client().responses.retrieve('resp_unnumbered', { stream: true, starting_after: read - 1 });
    const types: string[] = [];
    for await (const ev of resumed) {
      types.push(ev.type);
      if (ev.type === 'response.output_text.delta') texts.push(ev.delta);
    }
    expect(read + types.length).to.equal(frames.length);
    expect(texts.join('')).to.equal(pieces.join(''));
    const after3 = await rawRequest(`${t.base}/responses/resp_unnumbered?stream=true&starting_after=3`, { headers: { 'x-sarsen-key': t.key } });
    expect(after3.body.toString()).to.equal(frames.slice(4).join(''));
    const terminal = JSON.parse(frames.at(-1)!.split('data: ')[1]!);
    expect((await get('/responses/resp_unnumbered')).body.toString()).to.equal(JSON.stringify(terminal.response));
    expect(calls()).to.have.length(1);
    noBackground(calls()[0]!);
  });

  it('two identical background bodies at once make one provider call and name one response', async () => {
    const release = gate();
    provider.enqueue({ kind: 'json', body: responsesBody('once', { id: 'resp_once' }), after: release.until });
    const body = { model: 'gpt-test', input: marker(), background: true } as const;
    const [a, b] = await Promise.all([client().responses.create(body), client().responses.create(body)]);
    expect(a.id).to.equal(b.id);
    release.open();
    await until(async () => ((await client().responses.retrieve(a.id)).status === 'completed' ? true : undefined));
    expect(calls()).to.have.length(1);
  });

  it('cancel closes the provider connection; the response stays cancelled, and a second cancel answers the same', async () => {
    provider.enqueue({ kind: 'hang' });
    const created = await client().responses.create({ model: 'gpt-test', input: marker(), background: true });
    await provider.waitForRequests(1);
    const cancelled = await client().responses.cancel(created.id);
    expect(cancelled).to.include({ id: created.id, status: 'cancelled', background: true });
    await until(async () => (calls()[0]!.clientAborted ? true : undefined));
    expect((await client().responses.retrieve(created.id)).status).to.equal('cancelled');
    expect(await client().responses.cancel(created.id)).to.deep.equal(cancelled);
    expect(calls()).to.have.length(1);
  });

  it('cancelling a response that has ended answers it as it stands', async () => {
    const done = await client().responses.create({ model: 'gpt-test', input: marker() });
    const again = await client().responses.cancel(done.id);
    const { output_text: _, ...stored } = done; // the SDK adds output_text to what create answers
    expect(again).to.deep.equal(stored);
  });

  it('a synchronous response is retrievable by the provider\'s id with no second provider call; its stream too', async () => {
    const answer = await client().responses.create({ model: 'gpt-test', input: marker() });
    expect(answer.id).to.match(/^resp_fake_/);
    expect(await client().responses.retrieve(answer.id)).to.deep.equal(answer);
    provider.enqueue({ kind: 'sse', frames: responsesFrames(['one ', 'two'], { id: 'resp_sync_stream' }) });
    const stream = await client().responses.create({ model: 'gpt-test', input: marker(), stream: true });
    for await (const _ of stream) { /* read it all */ }
    const replayed = await client().responses.retrieve('resp_sync_stream', { stream: true, starting_after: 3 });
    const deltas: string[] = [];
    for await (const ev of replayed) if (ev.type === 'response.output_text.delta') deltas.push(ev.delta);
    expect(deltas).to.deep.equal(['one ', 'two']);
    expect(calls()).to.have.length(2);
  });

  it('input_items lists the stored input in the vendor\'s list shape, paged; delete removes the payload and keeps the accounting', async () => {
    const input = [
      { role: 'user' as const, content: `first ${marker()}` },
      { role: 'assistant' as const, content: 'second' },
      { type: 'message' as const, role: 'user' as const, content: [{ type: 'input_text' as const, text: 'third' }] },
    ];
    const answer = await client().responses.create({ model: 'gpt-test', input });
    const page = await client().responses.inputItems.list(answer.id);
    expect(page.data.map((i: any) => i.content[0].text)).to.deep.equal(['third', 'second', input[0]!.content]);
    const asc: string[] = [];
    for await (const item of client().responses.inputItems.list(answer.id, { order: 'asc', limit: 2 })) asc.push((item as any).content[0].text);
    expect(asc).to.deep.equal([input[0]!.content, 'second', 'third']);
    const raw = json(await get(`/responses/${answer.id}/input_items?limit=1`));
    expect(raw).to.include({ object: 'list', has_more: true });
    expect(raw.first_id).to.equal(raw.last_id);

    const before = await query<any>(server.db, `SELECT cost_micros, total_tokens FROM sarsen.requests WHERE id = (SELECT request_id FROM sarsen.provider_response_ids WHERE provider_id = $1)`, [answer.id]);
    await client().responses.delete(answer.id);
    const gone = await client().responses.retrieve(answer.id).catch((e: unknown) => e);
    expect(gone).to.be.instanceOf(APIError);
    expect((gone as APIError).status).to.equal(410);
    const after = await query<any>(server.db, 
      `SELECT q.cost_micros, q.total_tokens, q.expired, (SELECT count(*) FROM sarsen.request_bodies b WHERE b.request_id = q.id)::int AS bodies,
              (SELECT count(*) FROM sarsen.responses r WHERE r.request_id = q.id)::int AS answers
         FROM sarsen.requests q WHERE id = (SELECT request_id FROM sarsen.provider_response_ids WHERE provider_id = $1)`, [answer.id]);
    expect(after[0]).to.include({ expired: true, bodies: 0, answers: 0, cost_micros: before[0].cost_micros, total_tokens: before[0].total_tokens });
  });

  it('another namespace\'s id, and an unknown one, are NotFoundError; a bad parameter is BadRequestError; errors are the vendor\'s shape', async () => {
    const answer = await client().responses.create({ model: 'gpt-test', input: marker() });
    for (const id of [answer.id, 'resp_never_seen']) {
      const err = await client(other).responses.retrieve(id).catch((e: unknown) => e);
      expect(err, id).to.be.instanceOf(NotFoundError);
    }
    const ownId = await client().responses.create({ model: 'gpt-test', input: marker(), background: true });
    expect(await client(other).responses.cancel(ownId.id).catch((e: unknown) => e)).to.be.instanceOf(NotFoundError);
    const bad = await client().responses.retrieve(answer.id, { stream: true }).catch((e: unknown) => e);
    expect(bad).to.be.instanceOf(BadRequestError);
    const raw = await get(`/responses/${answer.id}?stream=true&starting_after=minus-one`);
    expect(raw.status).to.equal(400);
    const body = json(raw);
    expect(body.error).to.have.keys(['message', 'type', 'param', 'code']);
    expect(body.error).to.include({ type: 'invalid_request_error', param: null, code: 'bad_request' });
  });
});
