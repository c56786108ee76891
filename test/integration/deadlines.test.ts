// Client-side deadlines (docs/operations.md "When the network goes silent"), one mechanism at a
// time, through the fault proxy on a real PostgreSQL: a round trip on a connection gone silent
// fails at its deadline as a connection loss, its connection is destroyed with a warning and a
// count, the process's other idle connections go with it, a LISTEN connection that went silent
// finds out by its own round trip, and a statement allowed longer by design gets its time.
import { expect } from 'chai';
import { createClient, createPool, followDeadline, isConnectionLoss, processConnections, type ConnectionConfig, type Pool } from '../../src/db/pool.ts';
import { LISTENER_PING_MS, longerDeadline } from '../../src/db/deadlines.ts';
import { connectionBudget } from '../../src/core/connection-budget.ts';
import { registry } from '../../src/metrics/metrics.ts';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { startFaultProxy, type FaultProxy } from '../support/fault-proxy.ts';
import { capturedLines } from '../support/log-guard.ts';

const DEADLINE_MS = 500;

const pidOf = async (pool: Pool) => (await pool.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;

async function discarded(purpose: string): Promise<number> {
  const metric = (await registry.getMetricsAsJSON()).find((m) => m.name === 'sarsen_database_connections_discarded_total');
  return (metric?.values ?? []).filter((v) => v.labels.purpose === purpose).reduce((n, v) => n + v.value, 0);
}

describe('database deadlines: a link gone silent', function () {
  this.timeout(60_000);
  let db: TestDatabase;
  let proxy: FaultProxy;
  let conn: ConnectionConfig;

  before(async () => {
    db = await createTestDatabase();
    proxy = await startFaultProxy({ host: db.conn.host, port: db.conn.port });
    conn = processConnections({ ...db.conn, host: '127.0.0.1', port: proxy.port }, 'wrk_DEADLINES', connectionBudget('both'));
    followDeadline(conn, () => DEADLINE_MS);
  });
  afterEach(() => proxy.heal());
  after(async () => {
    await proxy?.close();
    await db?.drop();
  });

  it('fails a round trip on a half-open connection at its deadline, as a connection loss, and never hands that connection out again', async () => {
    const pool = createPool(conn, { purpose: 'main' });
    try {
      const before = await discarded('main');
      const first = await pidOf(pool);
      proxy.set({ kind: 'half-open', newConnections: 'pass' });
      const started = performance.now();
      const err = await pool.query('SELECT 1').then(() => null, (e: unknown) => e);
      const took = performance.now() - started;
      expect(err, 'the query failed').to.be.an('error');
      expect(isConnectionLoss(err), 'as a connection loss').to.equal(true);
      expect((err as { code?: string }).code).to.equal('08006');
      expect(took, 'at its deadline, not the kernel\'s').to.be.at.least(DEADLINE_MS - 50).and.below(DEADLINE_MS * 10);
      expect(await pidOf(pool), 'a new connection').to.not.equal(first);
      expect(await discarded('main')).to.equal(before + 1);
      const warned = capturedLines().filter((l) => l.includes('missed its deadline') && l.includes('"purpose":"main"'));
      expect(warned, 'a warning names the purpose').to.not.be.empty;
    } finally {
      await pool.end();
    }
  });

  it('discards the idle connections of the same process with the one that missed its deadline', async () => {
    const pool = createPool(conn, { purpose: 'main' });
    const writers = createPool(conn, { purpose: 'writers', batches: true });
    try {
      // An idle connection in each pool, and their server processes.
      const idle = [await pidOf(pool), await pidOf(writers)];
      proxy.set({ kind: 'half-open', newConnections: 'pass' });
      // The main pool's idle connection, taken: its round trip misses the deadline.
      const held = await pool.connect();
      await held.query('SELECT 1').then(() => expect.fail('answered over a silent link'), () => undefined);
      held.release();
      // Neither pool meets a dead connection again: each answers at once, from a new one.
      for (const p of [pool, writers]) {
        const started = performance.now();
        expect(idle).to.not.include(await pidOf(p));
        expect(performance.now() - started, 'no deadline waited out').to.be.below(DEADLINE_MS);
      }
    } finally {
      await Promise.all([pool.end(), writers.end()]);
    }
  });

  it('has a LISTEN connection that went silent find out by a round trip of its own', async () => {
    const client = createClient(conn, 'sarsen-bus wrk_DEADLINES', 'bus');
    const lost = new Promise<Error>((resolve) => client.once('error', resolve));
    try {
      await client.connect();
      await client.query('LISTEN sarsen_deadlines_test');
      proxy.set({ kind: 'half-open', newConnections: 'pass' });
      const started = performance.now();
      const err = await Promise.race([lost, new Promise<null>((r) => setTimeout(r, LISTENER_PING_MS * 2 + DEADLINE_MS + 2000, null))]);
      expect(err, 'the silent LISTEN connection reported itself lost').to.be.an('error');
      expect(isConnectionLoss(err)).to.equal(true);
      expect(performance.now() - started).to.be.below(LISTENER_PING_MS + DEADLINE_MS + 2000);
    } finally {
      await client.end().catch(() => undefined);
    }
  });

  it('gives a statement allowed longer by design its time, and the connection deadline to the rest', async () => {
    const pool = createPool(conn, { purpose: 'main' });
    try {
      const slow = { text: 'SELECT pg_sleep(1)' };
      await pool.query(longerDeadline(slow, 5000));
      const err = await pool.query(slow).then(() => null, (e: unknown) => e);
      expect(isConnectionLoss(err), 'a second-long sleep misses a half-second deadline').to.equal(true);
    } finally {
      await pool.end();
    }
  });
});
