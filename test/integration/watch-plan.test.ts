// The watcher asks four times a second whether any lease has expired. That look must read the
// end of the lease index whatever the planner knows of the requests table: before its first
// ANALYZE (a new partition, or autovacuum off) an EXISTS over the table was planned as a
// sequential scan, which grew with every request the table held.
import { expect } from 'chai';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { track } from '../support/resources.ts';
import { createPool, type Pool } from '../../src/db/pool.ts';
import { submitBatch, type NewRequest } from '../../src/db/submissions.ts';
import { newId } from '../../src/core/ids.ts';
import { WATCH_SQL, watchExecutors } from '../../src/db/liveness.ts';

describe('the liveness watch', function () {
  this.timeout(60_000);
  let db: TestDatabase;
  let pool: Pool;
  let release: () => void;

  before(async () => {
    db = await createTestDatabase();
    pool = createPool(db.conn, { max: 1, name: 'sarsen-watch-probe' });
    release = track('pool', db.name);
  });
  after(async () => {
    await pool?.end();
    release?.();
    await db?.drop();
  });

  const submission = (): NewRequest => ({
    id: newId('req'), tenancyId: 'ten_probe', namespaceId: 'ns_probe', apiKeyId: 'key_probe', backendId: 'bk_probe', fallbackBackendIds: [],
    dialect: 'chat', streaming: false, model: 'm', upstreamModel: 'm', forwardedHeaders: [], hops: 0, body: '{}',
    identity: Buffer.from(newId('req')), sealedCredential: null, owner: 'wrk_probe', precounted: false, limits: null, cache: null,
  });

  it('finds an expired lease through the lease index, never by scanning the requests, before any ANALYZE', async () => {
    // Thousands of requests that held a lease and settled, as traffic leaves them; no statistics.
    for (let i = 0; i < 10; i++) {
      await submitBatch(pool, Array.from({ length: 500 }, submission), { windowMs: 600_000, feeMicros: 0, leaseMs: 30_000 }, 0);
    }
    await pool.query(`UPDATE sarsen.requests SET status = 'succeeded', lease_owner = NULL, lease_expires_at = NULL, finished_at = now()`);
    const plan = (await pool.query<{ 'QUERY PLAN': string }>(`EXPLAIN ${WATCH_SQL}`, ['wrk_probe', false])).rows.map((r) => r['QUERY PLAN']).join('\n');
    expect(plan).not.to.match(/Seq Scan on requests/);
    expect(plan).to.match(/Index Only Scan.* on requests\w*/);
    expect(await watchExecutors(pool, 'wrk_probe', false)).to.deep.equal({ dead: [], expired: false });

    // One lease past its end is found.
    await pool.query(`UPDATE sarsen.requests SET status = 'running', lease_owner = 'wrk_gone', lease_expires_at = now() - interval '1 second'
                       WHERE id = (SELECT min(id) FROM sarsen.requests)`);
    expect((await watchExecutors(pool, 'wrk_probe', false)).expired).to.equal(true);
  });
});
