// Anthropic's Message Batches API (issue 43) over real HTTP with the unmodified @anthropic-ai/sdk:
// Sarsen runs the batch itself, every line an ordinary request; the SDK follows results_url with
// the caller's key (docs/api.md "Batches").
import { expect } from 'chai';
import Anthropic, { NotFoundError, BadRequestError } from '@anthropic-ai/sdk';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, messagesBody, type FakeProvider, type JournalEntry } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, until } from '../support/http.ts';
import { setSetting } from '../../src/config/settings.ts';
import { gate } from './streaming-support.ts';

describe('Anthropic message batches', function () {
  this.timeout(90_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let other: Tenant;
  let unique = 0;
  const marker = () => `mbatch-${process.pid}-${++unique}`;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer({ settings: { retry_base_ms: 20, retry_max_ms: 50, batch_lines_in_flight: 2 } });
    t = await provision(server, provider);
    other = await provision(server, provider, { namespace: 'elsewhere' });
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });
  beforeEach(() => provider.reset());

  const client = (tenant = t) => new Anthropic({ baseURL: tenant.root, apiKey: tenant.key, maxRetries: 0 });
  const request = (customId: string, content: string) => ({
    custom_id: customId,
    params: { model: 'claude-test', max_tokens: 16, messages: [{ role: 'user' as const, content }] },
  });
  const contentOf = (e: JournalEntry) => e.json?.messages?.[0]?.content as string | undefined;
  const ended = (id: string) =>
    until(async () => {
      const b = await client().messages.batches.retrieve(id);
      return b.processing_status === 'ended' ? b : undefined;
    }, 60_000);
  const results = async (id: string) => {
    const out: Anthropic.Messages.Batches.MessageBatchIndividualResponse[] = [];
    for await (const r of await client().messages.batches.results(id)) out.push(r);
    return out;
  };
  /** The raw result lines, by custom_id. */
  const rawResults = async (url: string) => {
    const res = await rawRequest(url, { headers: { authorization: `Bearer ${t.key}` } });
    return new Map(res.body.toString('utf8').split('\n').filter(Boolean).map((l) => [(JSON.parse(l) as { custom_id: string }).custom_id, l]));
  };

  it('a batch of a few lines ends: every custom_id succeeded once, each message the provider\'s answer byte for byte; delete removes it', async () => {
    const m = marker();
    const answers = new Map<string, string>();
    provider.rule((e) => {
      const text = contentOf(e);
      if (!text?.startsWith(m)) return undefined;
      const body = `{"id":"msg_${text}", "type":"message","role":"assistant","model":"claude-test","content":[{"type":"text","text":"answer ${text}"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2,"output_tokens":3}}`;
      answers.set(text, body);
      return { kind: 'json', body };
    });
    const created = await client().messages.batches.create({ requests: ['a', 'b', 'c'].map((id) => request(id, `${m}-${id}`)) });
    expect(created.type).to.equal('message_batch');
    expect(created.id).to.match(/^msgbatch_/);
    expect(created.processing_status).to.equal('in_progress');
    expect(created.results_url).to.equal(null);
    const done = await ended(created.id);
    expect(done.request_counts).to.deep.equal({ processing: 0, succeeded: 3, errored: 0, canceled: 0, expired: 0 });
    expect(done.ended_at).to.be.a('string');
    const got = await results(created.id);
    expect(got.map((r) => r.custom_id).sort()).to.deep.equal(['a', 'b', 'c']);
    expect(got.every((r) => r.result.type === 'succeeded')).to.equal(true);
    const raw = await rawResults(done.results_url!);
    for (const id of ['a', 'b', 'c']) {
      expect(raw.get(id)).to.equal(`{"custom_id":"${id}","result":{"type":"succeeded","message":${answers.get(`${m}-${id}`)}}}`);
    }
    expect((await client().messages.batches.list({ limit: 100 })).data.map((b) => b.id)).to.include(created.id);
    expect(await client().messages.batches.delete(created.id)).to.deep.equal({ id: created.id, type: 'message_batch_deleted' });
    let caught: unknown;
    await client().messages.batches.retrieve(created.id).catch((err: unknown) => (caught = err));
    expect(caught).to.be.instanceOf(NotFoundError);
  });

  it('a refused line is errored with the provider\'s status and body; a line Sarsen refuses, with Sarsen\'s code', async () => {
    const m = marker();
    const refusal = `{"type":"error","error":{"type":"invalid_request_error","message":"no thanks ${m}"}}`;
    provider.rule((e) => (contentOf(e) === `${m}-refuse` ? { kind: 'refuse', status: 400, body: refusal } : undefined));
    const created = await client().messages.batches.create({
      requests: [request('good', `${m}-good`), request('refuse', `${m}-refuse`), { custom_id: 'unrouted', params: { model: 'gpt-routes-to-chat', max_tokens: 1, messages: [] } }],
    });
    const done = await ended(created.id);
    expect(done.request_counts).to.deep.equal({ processing: 0, succeeded: 1, errored: 2, canceled: 0, expired: 0 });
    const raw = await rawResults(done.results_url!);
    expect(raw.get('refuse')).to.equal(`{"custom_id":"refuse","result":{"type":"errored","error":${refusal}}}`);
    const unrouted = JSON.parse(raw.get('unrouted')!);
    // gpt-* routes to a chat backend: Sarsen would answer 422 on POST /messages.
    expect(unrouted.result.error.error).to.include({ type: 'invalid_request_error', code: 'unprocessable_entity' });
  });

  it('an invalid batch is refused naming the line', async () => {
    let caught: unknown;
    await client().messages.batches.create({ requests: [request('a', 'x'), request('a', 'y')] }).catch((err: unknown) => (caught = err));
    expect(caught).to.be.instanceOf(BadRequestError);
    expect((caught as BadRequestError).message).to.contain('requests.1.custom_id');
  });

  it('cancel mid-batch ends with the unstarted lines canceled and the counts adding up', async () => {
    const m = marker();
    const held = gate();
    provider.rule((e) => (contentOf(e)?.startsWith(m) ? { kind: 'json', body: messagesBody('done'), after: held.until } : undefined));
    const created = await client().messages.batches.create({ requests: Array.from({ length: 8 }, (_, i) => request(`r${i}`, `${m}-${i}`)) });
    await provider.waitUntil(() => provider.journal.filter((e) => contentOf(e)?.startsWith(m)).length === 2);
    const canceling = await client().messages.batches.cancel(created.id);
    expect(canceling.processing_status).to.equal('canceling');
    expect(canceling.cancel_initiated_at).to.be.a('string');
    held.open();
    const done = await ended(created.id);
    expect(done.request_counts).to.deep.equal({ processing: 0, succeeded: 2, errored: 0, canceled: 6, expired: 0 });
    const got = await results(created.id);
    expect(got.filter((r) => r.result.type === 'canceled')).to.have.length(6);
    expect(got).to.have.length(8);
  });

  it('a line that outlives the processing window ends expired', async () => {
    await setSetting(server.pool, 'message_batch_window_ms', '2000');
    await server.settings.refresh();
    try {
      const m = marker();
      const held = gate();
      provider.rule((e) => (contentOf(e)?.startsWith(m) ? { kind: 'json', body: messagesBody('late'), after: held.until } : undefined));
      const created = await client().messages.batches.create({ requests: Array.from({ length: 5 }, (_, i) => request(`r${i}`, `${m}-${i}`)) });
      await provider.waitUntil(() => provider.journal.filter((e) => contentOf(e)?.startsWith(m)).length === 2);
      await until(async () => ((await client().messages.batches.retrieve(created.id)).request_counts.expired === 3 ? true : undefined), 30_000);
      held.open();
      const done = await ended(created.id);
      expect(done.request_counts).to.deep.equal({ processing: 0, succeeded: 2, errored: 0, canceled: 0, expired: 3 });
      expect((await results(created.id)).filter((r) => r.result.type === 'expired')).to.have.length(3);
    } finally {
      await setSetting(server.pool, 'message_batch_window_ms', '86400000');
      await server.settings.refresh();
    }
  });

  it('another namespace\'s batch is 404', async () => {
    const created = await client().messages.batches.create({ requests: [request('a', marker())] });
    await ended(created.id);
    const elsewhere = client(other);
    for (const call of [
      () => elsewhere.messages.batches.retrieve(created.id),
      () => elsewhere.messages.batches.cancel(created.id),
      () => elsewhere.messages.batches.delete(created.id),
      () => elsewhere.messages.batches.results(created.id),
    ]) {
      let caught: unknown;
      await call().catch((err: unknown) => (caught = err));
      expect(caught).to.be.instanceOf(NotFoundError);
    }
    const raw = await rawRequest(`${other.base}/messages/batches/${created.id}/results`, { headers: { authorization: `Bearer ${other.key}` } });
    expect(raw.status).to.equal(404);
    expect((await elsewhere.messages.batches.list()).data.map((b) => b.id)).to.not.include(created.id);
  });
  it('takes a body above the 2 MiB submission limit, up to message_batch_max_bytes', async () => {
    const m = marker();
    // Three requests of 0.9 MiB each: 2.7 MiB in one body, each line under the submission limit.
    const big = 'x'.repeat(900 * 1024);
    const created = await client().messages.batches.create({ requests: ['a', 'b', 'c'].map((id) => request(id, `${m}-${id} ${big}`)) });
    const done = await ended(created.id);
    expect(done.request_counts).to.deep.equal({ processing: 0, succeeded: 3, errored: 0, canceled: 0, expired: 0 });
    await setSetting(server.pool, 'message_batch_max_bytes', String(1024 * 1024));
    await server.settings.refresh();
    try {
      let caught: unknown;
      await client().messages.batches.create({ requests: ['a', 'b'].map((id) => request(id, `${m}-again-${id} ${big}`)) }).catch((err: unknown) => (caught = err));
      expect((caught as { status?: number }).status).to.equal(413);
    } finally {
      await setSetting(server.pool, 'message_batch_max_bytes', '268435456');
      await server.settings.refresh();
    }
  });
  it('lists batches newest first with after_id and before_id, which the SDK follows page by page', async () => {
    const p = await provision(server, provider, { namespace: 'paged' });
    const c = new Anthropic({ baseURL: p.root, apiKey: p.key, maxRetries: 0 });
    const made: string[] = [];
    for (let i = 0; i < 3; i++) made.push((await c.messages.batches.create({ requests: [request(`p${i}`, marker())] })).id);
    const seen: string[] = [];
    for await (const b of c.messages.batches.list({ limit: 1 })) seen.push(b.id);
    expect(seen).to.deep.equal([...made].reverse());
    const page = await c.messages.batches.list({ limit: 1, after_id: made[2] });
    expect(page.data.map((b) => b.id)).to.deep.equal([made[1]]);
    expect(page.has_more).to.equal(true);
    const newer = await c.messages.batches.list({ limit: 1, before_id: made[0] });
    expect(newer.data.map((b) => b.id)).to.deep.equal([made[1]]);
    expect(newer).to.include({ first_id: made[1], last_id: made[1] });
  });
});
