// A statement the server refuses (a unique violation, a raised exception) leaves its pooled
// connection open: pg's own pool.query closed it, and every refused input then paid for a new
// connection. A connection the server ends is still let go.
import { expect } from 'chai';
import { createPool, type Pool } from '../../src/db/pool.ts';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';

describe('pooled connections after errors', function () {
  this.timeout(30_000);
  let db: TestDatabase;
  let pool: Pool;
  const pid = async () => (await pool.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;

  before(async () => {
    db = await createTestDatabase();
    pool = createPool(db.conn, { max: 1, name: 'sarsen-pool-errors' });
  });
  after(async () => {
    await pool?.end();
    await db?.drop();
  });

  it('keeps the connection through statement errors, prepared statements included', async () => {
    const first = await pid();
    await pool.query('CREATE TEMP TABLE once (k int PRIMARY KEY)');
    await pool.query('INSERT INTO once VALUES (1)');
    for (const bad of ['INSERT INTO once VALUES (1)', `SELECT 1/0`, `DO $$ BEGIN RAISE EXCEPTION 'refused'; END $$`]) {
      const err = await pool.query(bad).then(() => null, (e: Error) => e);
      expect(err, bad).to.be.an('error');
      expect(await pid(), `after: ${bad}`).to.equal(first);
    }
    const named = { name: 'sarsen_pool_errors_probe', text: 'SELECT $1::int AS n' };
    expect((await pool.query({ ...named, values: [7] })).rows[0].n).to.equal(7);
    await pool.query({ ...named, values: ['seven'] }).then(() => expect.fail('refused'), () => undefined);
    expect((await pool.query({ ...named, values: [8] })).rows[0].n).to.equal(8);
    expect(await pid()).to.equal(first, 'the temp table and the prepared statement lived on one connection');
  });

  it('lets go of a connection the server terminated', async () => {
    const victim = await pid();
    const admin = testPool(db.conn, 1);
    try {
      // Terminated while a statement of it runs: that statement fails with 57P01.
      const running = pool.query('SELECT pg_sleep(5)').then(() => null, (e: Error & { code?: string }) => e);
      await new Promise((r) => setTimeout(r, 300));
      await admin.query('SELECT pg_terminate_backend($1)', [victim]);
      expect((await running)?.code).to.equal('57P01');
    } finally {
      await admin.end();
    }
    expect(await pid()).to.not.equal(victim);
  });
});
