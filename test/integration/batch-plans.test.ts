// The group-commit writers' statements are planned once per connection (generic plans, see
// src/db/pool.ts), usually while the tables are small. A plan that reached a table by a
// sequential scan then would keep scanning it once it held a backlog of tens of thousands of
// rows (the backstop jobs of every running request, the claims, the requests), for as long as
// nothing replans it (with autovacuum off, never). Every table they touch is reached through
// an index, whatever its size when the plan was made.
import { expect } from 'chai';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { track } from '../support/resources.ts';
import { createBatchPool, type Pool } from '../../src/db/pool.ts';
import { submitBatch } from '../../src/db/submissions.ts';
import { claimAttempts, renewLeases, settleBatch } from '../../src/db/attempts.ts';
import { storeFrames } from '../../src/db/chunks.ts';

describe('batch statement plans', function () {
  this.timeout(30_000);
  let db: TestDatabase;
  let pool: Pool;
  let release: () => void;

  before(async () => {
    db = await createTestDatabase();
    // One connection: every statement below is prepared, and explained, on it.
    pool = createBatchPool(db.conn, 'sarsen-plan-probe', 1);
    release = track('pool', db.name);
  });
  after(async () => {
    await pool?.end();
    release?.();
    await db?.drop();
  });

  it('reach every table through an index, even planned while the tables are small', async () => {
    // A few jobs, analysed as autovacuum would in a deployment's first minutes: small enough
    // for a scan to look cheaper.
    await pool.query(`SELECT graphile_worker.add_job('execute_request', json_build_object('n', n)) FROM generate_series(1, 3) AS n`);
    await pool.query('ANALYZE');
    await submitBatch(pool, [], { windowMs: 600_000, feeMicros: 0, leaseMs: 30_000 }, 0);
    await claimAttempts(pool, [], 'wrk_probe', 30_000);
    await renewLeases(pool, [], 30_000);
    await settleBatch(pool, [], { metering: true, origin: 'wrk_probe', counterShard: 0 });
    await storeFrames(pool, [], 'wrk_probe');
    const { rows } = await pool.query<{ name: string; types: string[] }>(
      `SELECT name, parameter_types::text[] AS types FROM pg_prepared_statements WHERE name LIKE 'sarsen\\_%' ORDER BY name`,
    );
    expect(rows.map((r) => r.name)).to.include.members(['sarsen_submit_batch', 'sarsen_claim_batch', 'sarsen_renew_leases', 'sarsen_settle_batch']);
    expect(rows.length).to.be.greaterThanOrEqual(5);
    const scans: string[] = [];
    for (const r of rows) {
      const args = r.types.map((t) => `NULL::${t}`).join(', ');
      const plan = await pool.query<{ 'QUERY PLAN': string }>(`EXPLAIN EXECUTE ${r.name}(${args})`);
      for (const line of plan.rows.map((p) => p['QUERY PLAN'])) {
        const scan = /Seq Scan on (\S+)/.exec(line);
        if (scan) scans.push(`${r.name}: ${scan[1]}`);
      }
    }
    expect(scans).to.deep.equal([]);
  });
});
