// Ending a pool closes its connections before it resolves: at shutdown the embedded database is
// stopped right after, and a connection it ended first would be logged as an outage.
import { expect } from 'chai';
import { createPool } from '../../src/db/pool.ts';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';

describe('ending a pool', function () {
  this.timeout(30_000);
  let db: TestDatabase;
  before(async () => {
    db = await createTestDatabase();
  });
  after(async () => {
    await db?.drop();
  });

  it('resolves only once the server has no connection of it left', async () => {
    const observer = testPool(db.conn, 1);
    try {
      for (let round = 0; round < 10; round++) {
        const name = `sarsen-end-probe-${round}`;
        const pool = createPool(db.conn, { max: 8, name });
        const clients = await Promise.all(Array.from({ length: 8 }, () => pool.connect()));
        for (const client of clients) client.release();
        await pool.end();
        const { rows } = await observer.query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1`, [name]);
        expect(rows[0]!.n, `round ${round}`).to.equal(0);
      }
    } finally {
      await observer.end();
    }
  });
});
