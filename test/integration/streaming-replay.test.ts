// Replay by id (retrieval, resuming with Last-Event-ID, and each state's SSE answer):
// `id: <seq>` before each stored frame, per-state behaviour, and Last-Event-ID resume from every
// position of a 200-frame stream, past the end while it is still live.
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json, until } from '../support/http.ts';
import { replayStream, stripIds, withIds, bytesOf, failedEventData, query, gate, STORED_SEQ } from './streaming-support.ts';

describe('streaming: replay by id', function () {
  this.timeout(90_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let unique = 0;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer({ settings: { retry_base_ms: 20, retry_max_ms: 50 } });
    t = await provision(server, provider);
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });
  beforeEach(() => provider.reset());

  /** POST /requests with a streaming chat body; answers the request id. */
  const submit = async (extra: object = {}): Promise<string> => {
    const res = await rawRequest(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', stream: true, messages: [{ role: 'user', content: `replay ${process.pid} ${++unique}` }], ...extra }),
    });
    expect(res.status).to.equal(202);
    return json(res).request_id as string;
  };
  const state = async (id: string) =>
    (await query<{ status: string; attempts: number; stored_seq: number }>(server.db, `SELECT status, attempts, ${STORED_SEQ} FROM sarsen.requests WHERE id = $1`, [id]))[0]!;
  const settled = (id: string) =>
    until(async () => {
      const r = json(await rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key } }));
      return r.status === 'succeeded' || r.status === 'failed' ? r : undefined;
    });

  it('succeeded: each stored frame behind `id: <seq>`, then the end; removing the id lines gives the provider\'s bytes', async () => {
    const frames = chatFrames(['a', 'b', 'c'], { usage: true, lineEnding: '\r\n' });
    provider.enqueue({ kind: 'sse', frames });
    const id = await submit();
    await settled(id);
    const res = await replayStream(t, id).done;
    expect(res.status).to.equal(200);
    expect(res.headers['content-type']).to.match(/^text\/event-stream/);
    expect(res.complete).to.equal(true);
    expect(res.body.equals(withIds(frames))).to.equal(true);
    expect(stripIds(res.body).equals(bytesOf(frames))).to.equal(true);
  });

  it('failed: the stored frames, then event: failed with the stored error and no id', async () => {
    const frames = chatFrames(['x', 'y', 'z']);
    provider.enqueue({ kind: 'sse', frames, frameDelayMs: 5, dropAfter: 2 });
    const id = await submit();
    const rec = await settled(id);
    expect(rec.status).to.equal('failed');
    const res = await replayStream(t, id).done;
    expect(res.complete).to.equal(true);
    const sent = withIds(frames.slice(0, 2));
    expect(res.body.subarray(0, sent.length).equals(sent)).to.equal(true);
    const tail = res.body.subarray(sent.length).toString();
    expect(tail).to.match(/^event: failed\n/);
    expect(tail).to.not.match(/^id:/m);
    expect(failedEventData(tail)).to.deep.equal(rec.error);
  });

  it('pending: waits for the first frame of the next attempt, then follows it', async () => {
    const frames = chatFrames(['after', ' the', ' retry']);
    provider.enqueue({ kind: 'refuse', status: 503, retryAfter: '1' }, { kind: 'sse', frames, frameDelayMs: 10 });
    const id = await submit();
    await until(async () => {
      const s = await state(id);
      return s.status === 'pending' && s.attempts === 1 ? s : undefined;
    });
    const reader = replayStream(t, id);
    await new Promise((r) => setTimeout(r, 300));
    expect(reader.bytes().length).to.equal(0); // nothing to send while pending
    expect((await state(id)).status).to.equal('pending');
    const res = await reader.done;
    expect(res.body.equals(withIds(frames))).to.equal(true);
    expect(provider.journal).to.have.length(2);
  });

  it('pending that fails before any frame: the replay answers the terminal state (event: failed with the provider\'s refusal)', async () => {
    const refusal = '{"error":{"message":"no such model","type":"invalid_request_error"}}';
    provider.enqueue({ kind: 'refuse', status: 503, retryAfter: '1' }, { kind: 'refuse', status: 404, body: refusal });
    const id = await submit();
    await until(async () => ((await state(id)).status === 'pending' && (await state(id)).attempts === 1 ? true : undefined));
    const res = await replayStream(t, id).done;
    expect(res.complete).to.equal(true);
    expect(res.body.toString()).to.equal(`event: failed\ndata: ${refusal}\n\n`);
  });

  it('running: replays what is stored at once, then live-tails to the end', async () => {
    const frames = chatFrames(Array.from({ length: 30 }, (_, i) => `p${i} `));
    // The provider waits after ten frames until the reader has them: those came from storage.
    const rest = gate();
    provider.enqueue({ kind: 'sse', frames, frameDelayMs: 5, waitBefore: { 10: rest.until } });
    const id = await submit();
    await until(async () => ((await state(id)).stored_seq >= 10 ? true : undefined));
    const reader = replayStream(t, id);
    await reader.waitFor((s) => (s.match(/^id: /gm)?.length ?? 0) >= 10);
    expect(reader.bytes().equals(withIds(frames.slice(0, 10))), 'the stored ten, while the provider waits').to.equal(true);
    expect((await state(id)).status).to.equal('running');
    const stored = reader.arrivals.length;
    rest.open();
    const res = await reader.done;
    expect(res.body.equals(withIds(frames))).to.equal(true);
    // The rest arrived after the provider wrote it.
    expect(reader.arrivals.length).to.be.greaterThan(stored);
  });

  it('Last-Event-ID resumes at n+1 from every position of a 200-frame stream, opened while it is live (mostly past the end) and after', async () => {
    const frames = chatFrames(Array.from({ length: 197 }, (_, i) => `w${i} `));
    expect(frames).to.have.length(200);
    // The provider holds its first frame until every reader is open, and its 101st until each
    // has what came before it.
    const [first, middle] = [gate(), gate()];
    provider.enqueue({ kind: 'sse', frames, frameDelayMs: 2, waitBefore: { 0: first.until, 100: middle.until } });
    const id = await submit();
    await until(async () => ((await state(id)).status === 'running' ? true : undefined));
    // Opened before the provider's first frame: every resume point above zero is past the end.
    const live = Array.from({ length: 201 }, (_, n) => ({ n, reader: replayStream(t, id, n) }));
    await Promise.all(live.map(({ reader }) => reader.head));
    expect(live.filter(({ reader }) => reader.arrivals.length > 0).map(({ n }) => n), 'bytes before the first frame').to.deep.equal([]);
    first.open();
    // Each got its frames as they were produced: up to the 100th while the provider waits.
    for (const { n, reader } of live) {
      if (n < 100) await reader.waitFor((s) => s === withIds(frames.slice(n, 100), n + 1).toString('latin1'));
    }
    expect(live.filter(({ n, reader }) => n >= 100 && reader.arrivals.length > 0).map(({ n }) => n), 'bytes past the 100th, before it was written').to.deep.equal([]);
    middle.open();
    for (const { n, reader } of live) {
      const res = await reader.done;
      expect(res.complete, `live, Last-Event-ID ${n}`).to.equal(true);
      expect(res.body.equals(withIds(frames.slice(n), n + 1)), `live, Last-Event-ID ${n}`).to.equal(true);
    }
    expect((await state(id)).status).to.equal('succeeded');
    for (let n = 0; n <= 200; n += 20) {
      const batch = Array.from({ length: Math.min(20, 201 - n) }, (_, i) => n + i);
      const answers = await Promise.all(batch.map((k) => replayStream(t, id, k).done));
      answers.forEach((res, i) => {
        const k = batch[i]!;
        expect(res.body.equals(withIds(frames.slice(k), k + 1)), `settled, Last-Event-ID ${k}`).to.equal(true);
      });
    }
    // Past the end of a settled stream: nothing, and the end.
    const beyond = await replayStream(t, id, 500).done;
    expect(beyond.complete).to.equal(true);
    expect(beyond.body.length).to.equal(0);
  });

  it('a request that was not streamed answers 400 bad_request; so does a Last-Event-ID that is not a number', async () => {
    const res = await rawRequest(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: `plain ${++unique}` }] }),
    });
    const plain = json(res).request_id as string;
    await settled(plain);
    const refused = await replayStream(t, plain).done;
    expect(refused.status).to.equal(400);
    expect(JSON.parse(refused.body.toString()).error.code).to.equal('bad_request');
    provider.enqueue({ kind: 'sse', frames: chatFrames(['s']) });
    const streamed = await submit();
    await settled(streamed);
    const bad = await replayStream(t, streamed, 'abc').done;
    expect(bad.status).to.equal(400);
    expect(JSON.parse(bad.body.toString()).error.code).to.equal('bad_request');
  });
});
