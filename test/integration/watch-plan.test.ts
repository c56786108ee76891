// The watcher asks four times a second whether any lease has expired, and runs the full sweep
// every two seconds. Those looks must cost what the live work costs, whatever the planner
// knows of the requests table: before its first ANALYZE (a new partition, or autovacuum off)
// each was planned as a sequential scan, which grew with every request the table held.
import { expect } from 'chai';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';
import { submitBatch, type NewRequest } from '../../src/db/submissions.ts';
import { newId } from '../../src/core/ids.ts';
import { WATCH_SQL, watchExecutors } from '../../src/db/liveness.ts';
import { recoverDeadAttempts, redispatchStranded } from '../../src/db/recovery.ts';

describe('the liveness watch and the recovery sweep', function () {
  this.timeout(60_000);
  let db: TestDatabase;
  let pool: ReturnType<typeof testPool>;

  // A database each: each test finds the requests as its own seeding left them, never analysed.
  beforeEach(async () => {
    db = await createTestDatabase();
    pool = testPool(db.conn, 1);
  });
  afterEach(async () => {
    await pool?.end();
    await db?.drop();
  });

  const submission = (): NewRequest => ({
    id: newId('req'), tenancyId: 'ten_probe', namespaceId: 'ns_probe', apiKeyId: 'key_probe', backendId: 'bk_probe', fallbackBackendIds: [],
    dialect: 'chat', streaming: false, model: 'm', upstreamModel: 'm', forwardedHeaders: [], hops: 0, body: '{}',
    identity: Buffer.from(newId('req')), sealedCredential: null, owner: 'wrk_probe', precounted: false, limits: null, cache: null,
  });

  /** Thousands of requests that held a lease and settled, as traffic leaves them; no statistics. */
  const settledRequests = async () => {
    for (let i = 0; i < 10; i++) {
      await submitBatch(pool, Array.from({ length: 500 }, submission), { windowMs: 600_000, feeMicros: 0, leaseMs: 30_000 });
    }
    await pool.query(`UPDATE sarsen.requests SET status = 'succeeded', lease_owner = NULL, lease_expires_at = NULL, finished_at = now()`);
  };

  /** The oldest request running again, its lease a second past its end, as a dead executor leaves it; its id. */
  const expiredLease = async (): Promise<string> => {
    const { rows } = await pool.query<{ id: string }>(`UPDATE sarsen.requests SET status = 'running', lease_owner = 'wrk_gone', lease_expires_at = now() - interval '1 second'
                       WHERE id = (SELECT min(id) FROM sarsen.requests) RETURNING id`);
    return rows[0]!.id;
  };

  it('finds an expired lease through the lease index, never by scanning the requests, before any ANALYZE', async () => {
    await settledRequests();
    const plan = (await pool.query<{ 'QUERY PLAN': string }>(`EXPLAIN ${WATCH_SQL}`, ['wrk_probe', false])).rows.map((r) => r['QUERY PLAN']).join('\n');
    expect(plan).not.to.match(/Seq Scan on requests/);
    expect(plan).to.match(/Index Only Scan.* on requests\w*/);
    expect(await watchExecutors(pool, 'wrk_probe', false)).to.deep.equal({ dead: [], expired: false });

    // One lease past its end is found.
    await expiredLease();
    expect((await watchExecutors(pool, 'wrk_probe', false)).expired).to.equal(true);
  });

  /** Sequential scans of the requests' partitions so far, as the statistics collector has them (the pool's one backend flushed). */
  const requestScans = async (): Promise<number> => {
    await pool.query('SELECT pg_stat_force_next_flush()');
    const { rows } = await pool.query<{ n: string }>(
      `SELECT coalesce(sum(seq_scan), 0)::text AS n FROM pg_stat_user_tables WHERE schemaname = 'sarsen' AND relname LIKE 'requests\\_%'`,
    );
    return Number(rows[0]!.n);
  };

  it('runs the full sweep without scanning the requests, and still recovers the expired lease', async () => {
    await settledRequests();
    const expired = await expiredLease();
    const before = await requestScans();
    const recovered = await recoverDeadAttempts(pool, 'wrk_probe', 100, false);
    expect(await redispatchStranded(pool, 30_000)).to.deep.equal([]);
    expect(await requestScans()).to.equal(before);
    expect(recovered.map((r) => r.id)).to.deep.equal([expired]);
    const { rows } = await pool.query(`SELECT status, recoveries FROM sarsen.requests WHERE id = $1`, [expired]);
    expect(rows).to.deep.equal([{ status: 'pending', recoveries: 1 }]);
  });
});
