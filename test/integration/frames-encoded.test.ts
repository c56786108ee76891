// A stream's frames are stored as differences from the frame before (src/core/frame-delta.ts,
// docs/storage.md "How frames are stored"): the rows hold a small part of the bytes, yet storage
// counts the frames' own bytes, a replay from any Last-Event-ID is the provider's bytes, a
// reader in another process follows them, and rows written whole before migration 034 still read.
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json } from '../support/http.ts';
import { replayStream, withIds, bytesOf } from './streaming-support.ts';
import { settled } from '../support/chaos.ts';
import { recountStorage } from '../../src/db/accounting.ts';
import { KEYFRAME_EVERY } from '../../src/core/frame-delta.ts';

describe('frames stored as differences', function () {
  this.timeout(120_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer();
    t = await provision(server, provider);
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });

  const words = [' the', ' quick', ' Über', ' naïve', ' 😀', ' "quoted"', '\\', ' fox'];
  async function stream(content: string, count: number, frameDelayMs = 0): Promise<{ id: string; frames: string[] }> {
    const frames = chatFrames(Array.from({ length: count }, (_, i) => `${words[i % words.length]}${i}`), { usage: true });
    provider.enqueue({ kind: 'sse', frames, frameDelayMs });
    const accepted = await rawRequest(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', stream: true, messages: [{ role: 'user', content }] }),
    });
    return { id: json(accepted).request_id as string, frames };
  }

  it('stores a stream in a fraction of its bytes, counts its bytes exactly, and replays it from every frame', async () => {
    // Frames 2 ms apart: most rows hold one frame, each the difference from the row before.
    const { id, frames } = await stream('encoded', 3 * KEYFRAME_EVERY + 5, 2);
    await settled(server.pool, [id], 60_000);
    const { rows } = await server.pool.query<{ rows: number; stored: number; bytes: number; whole: number; chunk_bytes: number }>(
      `SELECT count(*)::int AS rows, sum(octet_length(c.frames))::int AS stored, sum(c.bytes)::int AS bytes,
              count(*) FILTER (WHERE get_byte(c.frames, 0) = ascii('K'))::int AS whole, max(q.chunk_bytes)::int AS chunk_bytes
         FROM sarsen.chunks c JOIN sarsen.requests q ON q.id = c.request_id WHERE c.request_id = $1`,
      [id],
    );
    const raw = bytesOf(frames).length;
    expect(rows[0]!.bytes, 'the frames\' own bytes').to.equal(raw);
    expect(rows[0]!.chunk_bytes, 'the request\'s stored bytes').to.equal(raw);
    expect(rows[0]!.stored, 'what the rows hold').to.be.below(raw / 3);
    expect(rows[0]!.whole, 'rows starting with a whole frame').to.be.below(rows[0]!.rows);
    const storage = json(await rawRequest(`${t.base}/storage`, { headers: { 'x-sarsen-key': t.key } }));
    expect(storage.chunk_bytes).to.equal(Number((await recountStorage(server.pool, t.namespaceId)).chunk_bytes));
    expect(storage.chunk_bytes).to.equal(raw);

    const whole = await replayStream(t, id).done;
    expect(whole.body.equals(withIds(frames))).to.equal(true);
    for (let after = 1; after < frames.length; after++) {
      const resumed = await replayStream(t, id, after).done;
      expect(resumed.body.equals(withIds(frames.slice(after), after + 1)), `resumed after ${after}`).to.equal(true);
    }
  });

  it('reads rows written whole before migration 034 beside encoded ones', async () => {
    const { id, frames } = await stream('legacy', 40, 2);
    await settled(server.pool, [id], 60_000);
    // The rows of the stream's first twenty frames rewritten as a release before 034 stored
    // them: a frame a row, whole, without a marker, `bytes` NULL.
    const { rows } = await server.pool.query<{ cut: number }>(
      `DELETE FROM sarsen.chunks WHERE request_id = $1 AND last_seq - coalesce(cardinality(frame_lengths), 1) < 20 RETURNING last_seq AS cut`,
      [id],
    );
    const cut = Math.max(...rows.map((r) => r.cut));
    expect(cut).to.be.within(20, 38);
    await server.pool.query(
      `INSERT INTO sarsen.chunks (request_id, last_seq, attempt, frames) SELECT $1, n, 1, convert_to(($2::text[])[n], 'UTF8') FROM generate_series(1, $3::int) AS n`,
      [id, frames, cut],
    );
    const whole = await replayStream(t, id).done;
    expect(whole.body.equals(withIds(frames))).to.equal(true);
    for (const after of [5, cut - 1, cut, cut + 1, 33]) {
      const resumed = await replayStream(t, id, after).done;
      expect(resumed.body.equals(withIds(frames.slice(after), after + 1)), `resumed after ${after}`).to.equal(true);
    }
    expect(Number((await recountStorage(server.pool, t.namespaceId)).chunk_bytes)).to.be.greaterThan(0);
  });
});
