// Sarsen's pools never JIT-compile a statement (docs/decisions.md "No JIT"): their generic plans'
// estimates pass jit_above_cost on a large deployment, and compiling took 45-55 ms of a 2 ms
// read. The database here is told to compile every statement, as a large one would be.
import { expect } from 'chai';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { track } from '../support/resources.ts';
import { createBatchPool, createPool, type Pool } from '../../src/db/pool.ts';

describe('JIT', function () {
  let db: TestDatabase;
  const pools: Pool[] = [];
  let release: () => void;

  before(async () => {
    db = await createTestDatabase();
    release = track('pool', db.name);
    const admin = createPool(db.conn, { max: 1, name: 'sarsen-test' });
    try {
      await admin.query(`ALTER DATABASE ${db.name} SET jit_above_cost = 0`);
    } finally {
      await admin.end();
    }
    pools.push(createPool(db.conn, { max: 1 }), createBatchPool(db.conn, 'sarsen-jit-probe', 1));
  });
  after(async () => {
    await Promise.all(pools.map((p) => p.end()));
    release?.();
    await db?.drop();
  });

  it('is off on the main pool and on the writers\' connections, whatever the database says', async () => {
    for (const pool of pools) {
      expect((await pool.query<{ jit: string }>('SHOW jit')).rows[0]!.jit).to.equal('off');
      expect((await pool.query<{ jit_above_cost: string }>('SHOW jit_above_cost')).rows[0]!.jit_above_cost).to.equal('0');
      const plan = (await pool.query<{ 'QUERY PLAN': string }>('EXPLAIN (ANALYZE) SELECT count(*) FROM sarsen.requests')).rows.map((r) => r['QUERY PLAN']).join('\n');
      expect(plan).to.not.include('JIT');
    }
  });
});
