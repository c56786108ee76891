// A streaming submission decides on its first item and reports a
// failure after it as `event: failed` (rule 6): every row of the first-item table over real
// HTTP, with the fake provider scripting the outcome.
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatFrames, messagesFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json, until } from '../support/http.ts';
import { postStream, replayStream, withIds, bytesOf, failedEventData, requestIdByMarker, gate } from './streaming-support.ts';

describe('streaming: the first item decides the answer', function () {
  this.timeout(60_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let unique = 0;
  const marker = () => `first-item-${process.pid}-${++unique}`;
  const chatBody = (m: string) => ({ model: 'gpt-test', stream: true, messages: [{ role: 'user', content: m }] });

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

  const record = (id: string) => rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key } }).then(json);

  it('a chunk: 200 text/event-stream only once the first frame exists, then the provider\'s frames without id lines', async () => {
    const m = marker();
    const frames = chatFrames(['a', 'b', 'c']);
    provider.enqueue({ kind: 'sse', frames, firstDelayMs: 400, frameDelayMs: 10 });
    const sentAt = performance.now();
    const reader = postStream(t, '/chat/completions', chatBody(m));
    const head = await reader.head;
    expect(head.status).to.equal(200);
    expect(head.headers['content-type']).to.match(/^text\/event-stream/);
    // The status line waited for the provider's first frame.
    expect(performance.now() - sentAt).to.be.at.least(380);
    const done = await reader.done;
    expect(done.complete).to.equal(true);
    expect(done.body.equals(bytesOf(frames))).to.equal(true);
    expect(done.body.toString()).to.not.match(/^id:/m);
  });

  it('a refusal the provider answered with: its status, its body byte for byte as JSON, and retry-after', async () => {
    const refusal = '{"error": {"message": "quota", "type":"insufficient_quota"},  "extra": [1.0]}';
    provider.enqueue({ kind: 'refuse', status: 403, body: refusal, retryAfter: '42' });
    const res = await postStream(t, '/chat/completions', chatBody(marker())).done;
    expect(res.status).to.equal(403);
    expect(res.headers['content-type']).to.match(/^application\/json/);
    expect(res.headers['retry-after']).to.equal('42');
    expect(res.body.toString()).to.equal(refusal);
  });

  it('a refusal on the messages route after a retried overload passes through as the provider said it', async () => {
    const refusal = '{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens too large"}}';
    provider.enqueue({ kind: 'refuse', status: 529 }, { kind: 'refuse', status: 400, body: refusal });
    const res = await postStream(t, '/messages', { model: 'claude-test', max_tokens: 1, stream: true, messages: [{ role: 'user', content: marker() }] }).done;
    expect(res.status).to.equal(400);
    expect(res.body.toString()).to.equal(refusal);
    expect(res.headers['retry-after']).to.equal(undefined);
    expect(provider.journal).to.have.length(2);
  });

  it('a failure that was not an HTTP answer (connections dropped before any byte, retries used up): 502 upstream_failed', async () => {
    provider.enqueue({ kind: 'drop' }, { kind: 'sse', frames: chatFrames(['x']), dropAfter: 0 }, { kind: 'drop' });
    const res = await postStream(t, '/chat/completions', chatBody(marker())).done;
    expect(res.status).to.equal(502);
    expect(res.headers['content-type']).to.match(/^application\/json/);
    expect(JSON.parse(res.body.toString()).error.code).to.equal('upstream_failed');
    expect(provider.journal).to.have.length(3);
  });

  it('a stream dropped before its first frame is retried like any transport failure, and the caller sees only the good attempt', async () => {
    const frames = chatFrames(['retried']);
    provider.enqueue({ kind: 'sse', frames: chatFrames(['lost']), dropAfter: 0 }, { kind: 'sse', frames });
    const res = await postStream(t, '/chat/completions', chatBody(marker())).done;
    expect(res.status).to.equal(200);
    expect(res.body.equals(bytesOf(frames))).to.equal(true);
    expect(provider.journal).to.have.length(2);
  });

  it('nothing within the hold: 504 held_too_long naming the request; execution carries on and replay gives the frames', async () => {
    const held = await startTestServer({ settings: { synchronous_hold_ms: 300 } });
    try {
      const h = await provision(held, provider);
      const frames = chatFrames(['late', ' but', ' here']);
      // The provider's first frame waits for the caller's answer: only the hold can end it.
      const answered = gate();
      provider.enqueue({ kind: 'sse', frames, frameDelayMs: 20, waitBefore: { 0: answered.until } });
      const started = performance.now();
      const res = await postStream(h, '/chat/completions', chatBody(marker())).done;
      answered.open();
      expect(res.status).to.equal(504);
      expect(performance.now() - started, 'not before the hold').to.be.at.least(250);
      const error = JSON.parse(res.body.toString()).error;
      expect(error.code).to.equal('held_too_long');
      const id = /req_[0-9A-Z]{26}/.exec(error.message)?.[0];
      expect(id, error.message).to.be.a('string');
      const done = await until(async () => {
        const r = json(await rawRequest(`${h.base}/requests/${id}`, { headers: { 'x-sarsen-key': h.key } }));
        return r.status === 'succeeded' ? r : undefined;
      });
      expect(done.streaming).to.equal(true);
      expect(provider.journal).to.have.length(1);
      expect(provider.journal[0]!.clientAborted).to.equal(false);
      const replayed = await replayStream(h, id!).done;
      expect(replayed.body.equals(withIds(frames))).to.equal(true);
    } finally {
      await held.close();
    }
  });

  it('a failure after the first frame arrives as event: failed with the stored error, after the frames already sent', async () => {
    const m = marker();
    const frames = chatFrames(['one', 'two', 'three', 'four']);
    provider.enqueue({ kind: 'sse', frames, frameDelayMs: 10, dropAfter: 3 });
    const res = await postStream(t, '/chat/completions', chatBody(m)).done;
    expect(res.status).to.equal(200);
    expect(res.complete).to.equal(true);
    const text = res.body.toString();
    const sent = bytesOf(frames.slice(0, 3)).toString();
    expect(text.startsWith(sent)).to.equal(true);
    const tail = text.slice(sent.length);
    expect(tail).to.match(/^event: failed\ndata: .+\n\n$/);
    expect(tail).to.not.match(/^id:/m);
    const id = await requestIdByMarker(server.db, m);
    const rec = await record(id);
    expect(rec.status).to.equal('failed');
    expect(failedEventData(tail)).to.deep.equal(rec.error);
    expect(rec.error.error.code).to.equal('upstream_failed');
    // Terminal once a frame was sent: no second provider call.
    expect(provider.journal).to.have.length(1);
  });

  it('every frame the provider sent before the connection dropped reaches the caller and the store', async () => {
    // Frames arriving while an earlier one is being committed must not be lost when the
    // connection then fails: a few rounds with frames 2 ms apart, the drop right after the last.
    for (let round = 0; round < 5; round++) {
      const m = marker();
      const frames = chatFrames(Array.from({ length: 10 }, (_, i) => `r${round}f${i} `));
      provider.enqueue({ kind: 'sse', frames, frameDelayMs: 2, dropAfter: 8 });
      const res = await postStream(t, '/chat/completions', chatBody(m)).done;
      const sent = bytesOf(frames.slice(0, 8));
      expect(res.body.subarray(0, sent.length).toString(), `round ${round}`).to.equal(sent.toString());
      expect(res.body.subarray(sent.length).toString()).to.match(/^event: failed\n/);
      const replayed = await replayStream(t, await requestIdByMarker(server.db, m)).done;
      const withIdsSent = withIds(frames.slice(0, 8));
      expect(replayed.body.subarray(0, withIdsSent.length).equals(withIdsSent), `round ${round}`).to.equal(true);
    }
  });

  it('the provider\'s own mid-stream error event is a frame, forwarded unchanged; the stream then ends as the provider ended it', async () => {
    const start = messagesFrames(['partial'], {}).slice(0, 3);
    const frames = [...start, 'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'];
    provider.enqueue({ kind: 'sse', frames, frameDelayMs: 5 });
    const m = marker();
    const res = await postStream(t, '/messages', { model: 'claude-test', max_tokens: 8, stream: true, messages: [{ role: 'user', content: m }] }).done;
    expect(res.status).to.equal(200);
    expect(res.body.equals(bytesOf(frames))).to.equal(true);
    const id = await requestIdByMarker(server.db, m);
    expect((await record(id)).status).to.equal('succeeded');
    expect((await replayStream(t, id).done).body.equals(withIds(frames))).to.equal(true);
  });
});
