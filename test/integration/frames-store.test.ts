// Storing stream frames is safe to repeat: when a flush's commit succeeds but its answer is lost
// with the connection, the chunk writer stores the same frames again, perhaps while the first run
// is still committing. The repeat must find them stored (not fail on the primary key, which would
// hand a healthy attempt back) and must not count their bytes twice.
import { expect } from 'chai';
import type pg from 'pg';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { startTestServer, type TestServer } from '../support/server.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { testPool } from '../support/db.ts';
import { namespaceTotals } from '../../src/db/accounting.ts';
import { storeFrames } from '../../src/db/chunks.ts';
import { wholeFrame } from '../../src/core/frame-delta.ts';

const frameRow = (requestId: string, attempt: number, seq: number, frame: Buffer) => ({ requestId, attempt, seq, frame, stored: wholeFrame(frame) });

describe('storing stream frames again', function () {
  this.timeout(60_000);
  let provider: FakeProvider;
  let server: TestServer;
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

  /** A stream that has stored one frame and holds its request running: its id and attempt. */
  async function heldStream(pool: pg.Pool, content: string): Promise<{ id: string; attempt: number }> {
    provider.rule(() => ({ kind: 'sse', frames: ['data: {"first":true}\n\n', 'data: [DONE]\n\n'], frameDelayMs: 30_000 }));
    const res = await fetch(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', stream: true, messages: [{ role: 'user', content }] }),
    });
    expect(res.status).to.equal(202);
    const { request_id: id } = (await res.json()) as { request_id: string };
    for (let i = 0; i < 200; i++) {
      const { rows } = await pool.query<{ attempts: number }>(
        `SELECT q.attempts FROM sarsen.requests q WHERE q.id = $1 AND q.status = 'running' AND EXISTS (SELECT 1 FROM sarsen.chunks k WHERE k.request_id = q.id)`,
        [id],
      );
      if (rows[0]) return { id, attempt: rows[0].attempts };
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error('the stream never stored its first frame');
  }
  const release = (pool: pg.Pool, id: string) =>
    pool.query(`UPDATE sarsen.requests SET status = 'failed', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL WHERE id = $1`, [id]);
  const chunkBytes = async (pool: pg.Pool) => Number((await namespaceTotals(pool, t.namespaceId)).chunk_bytes);

  it('answers the frames as stored and counts their bytes once', async () => {
    const pool = testPool(server.db.conn, 2);
    try {
      const { id, attempt } = await heldStream(pool, 'store twice');
      const before = await chunkBytes(pool);
      const frame = Buffer.from('data: {"stored":"twice"}\n\n');
      const row = frameRow(id, attempt, 1000, frame);
      const first = await storeFrames(pool, [row], 'test');
      const again = await storeFrames(pool, [row], 'test');
      expect(first.get(id)).to.deep.equal({ attempt, seq: 1000 });
      expect(again.get(id)).to.deep.equal({ attempt, seq: 1000 });
      expect(await chunkBytes(pool)).to.equal(before + frame.length);
      // Other bytes under a stored sequence number are not this flush's: they are refused.
      const other = await storeFrames(pool, [frameRow(id, attempt, 1000, Buffer.from('data: {"other":1}\n\n'))], 'test');
      expect(other.has(id)).to.equal(false);
      // One flush may carry a discarded attempt's last frames beside the live attempt's: only the
      // live attempt's are stored, and only their bytes are counted.
      const live = frameRow(id, attempt, 1001, Buffer.from('data: {"live":1}\n\n'));
      const discarded = frameRow(id, attempt - 1, 1002, Buffer.from('data: {"discarded":1}\n\n'));
      const mixed = await storeFrames(pool, [live, discarded], 'test');
      expect(mixed.get(id)).to.deep.equal({ attempt, seq: 1001 });
      const { rows: kept } = await pool.query<{ last_seq: number; attempt: number }>(
        'SELECT last_seq, attempt FROM sarsen.chunks WHERE request_id = $1 AND last_seq >= 1001 ORDER BY last_seq',
        [id],
      );
      expect(kept).to.deep.equal([{ last_seq: 1001, attempt }]);
      expect(await chunkBytes(pool)).to.equal(before + frame.length + live.frame.length);
      await release(pool, id);
    } finally {
      await pool.end();
    }
  });

  it('waits for a first run still committing, then answers its frames as stored, counted once', async () => {
    const pool = testPool(server.db.conn, 3);
    const other = await pool.connect();
    try {
      const { id, attempt } = await heldStream(pool, 'store while committing');
      const before = await chunkBytes(pool);
      const frame = Buffer.from('data: {"stored":"meanwhile"}\n\n');
      // The first run, still committing: its row is written, its transaction open.
      await other.query('BEGIN');
      await other.query('INSERT INTO sarsen.chunks (request_id, last_seq, attempt, frames, bytes) VALUES ($1, 2000, $2, $3, $4)', [id, attempt, wholeFrame(frame), frame.length]);
      const again = storeFrames(pool, [frameRow(id, attempt, 2000, frame)], 'test');
      await new Promise((r) => setTimeout(r, 300));
      // The first run's bytes, as its statement counts them, then its commit.
      await other.query(`INSERT INTO sarsen.counter_deltas (namespace_id, chunk_bytes) VALUES ($1, $2)`, [t.namespaceId, frame.length]);
      await other.query('COMMIT');
      expect((await again).get(id)).to.deep.equal({ attempt, seq: 2000 });
      expect(await chunkBytes(pool)).to.equal(before + frame.length);
      await release(pool, id);
    } finally {
      other.release();
      await pool.end();
    }
  });
});
