// A flush repeated while its first run is still committing (the connection was lost, the commit
// was not): the repeat meets the first run's rows uncommitted under the same keys. It waits for
// them, and once they are committed it must answer the frames as stored, not fail on the primary
// key (which would hand a healthy attempt back), and must not count their bytes twice.
import { expect } from 'chai';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { startTestServer, type TestServer } from '../support/server.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { testPool } from '../support/db.ts';
import { namespaceTotals } from '../../src/db/accounting.ts';
import { storeFrames } from '../../src/db/chunks.ts';

describe('storing stream frames while a repeat of the flush commits', function () {
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

  it('waits for the other run and answers the frames as stored, counted once', async () => {
    provider.rule(() => ({ kind: 'sse', frames: ['data: {"first":true}\n\n', 'data: [DONE]\n\n'], frameDelayMs: 30_000 }));
    const res = await fetch(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', stream: true, messages: [{ role: 'user', content: 'store while committing' }] }),
    });
    expect(res.status).to.equal(202);
    const { request_id: id } = (await res.json()) as { request_id: string };
    const pool = testPool(server.db.conn, 3);
    const other = await pool.connect();
    try {
      let attempt = 0;
      for (let i = 0; i < 200 && !attempt; i++) {
        const { rows } = await pool.query<{ attempts: number }>(
          `SELECT q.attempts FROM sarsen.requests q WHERE q.id = $1 AND q.status = 'running' AND EXISTS (SELECT 1 FROM sarsen.chunks k WHERE k.request_id = q.id)`,
          [id],
        );
        if (rows[0]) attempt = rows[0].attempts;
        else await new Promise((r) => setTimeout(r, 50));
      }
      expect(attempt, 'the stream stored its first frame').to.be.above(0);
      const before = Number((await namespaceTotals(pool, t.namespaceId)).chunk_bytes);
      const frame = Buffer.from('data: {"stored":"meanwhile"}\n\n');
      // The first run, still committing: its row is written, its transaction open.
      await other.query('BEGIN');
      await other.query('INSERT INTO sarsen.chunks (request_id, last_seq, attempt, frames) VALUES ($1, 2000, $2, $3)', [id, attempt, frame]);
      const again = storeFrames(pool, [{ requestId: id, attempt, seq: 2000, frame }], 'test');
      await new Promise((r) => setTimeout(r, 300));
      // The first run's bytes, as its statement counts them, then its commit.
      await other.query(`INSERT INTO sarsen.usage_rollup_deltas (namespace_id, chunk_bytes) VALUES ($1, $2)`, [t.namespaceId, frame.length]);
      await other.query('COMMIT');
      expect((await again).get(id)).to.deep.equal({ attempt, seq: 2000 });
      expect(Number((await namespaceTotals(pool, t.namespaceId)).chunk_bytes)).to.equal(before + frame.length);
      await pool.query(`UPDATE sarsen.requests SET status = 'failed', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL WHERE id = $1`, [id]);
    } finally {
      other.release();
      await pool.end();
    }
  });
});
