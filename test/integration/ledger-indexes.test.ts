// Every accepted submission writes a ledger entry, so every index on the ledger's months is an
// index entry each acceptance commit writes. The months are dropped whole at the ledger's horizon
// and read by namespace and time (usage) or by tenancy (billing), never by creation time alone:
// they carry no such index (migration 026). The legacy partition, the entries written before
// partitioning, is swept row by row by creation time, through an index of its own.
import { expect } from 'chai';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';
import { listPartitions, LEDGER } from '../../src/db/partitions.ts';
import { sweepLedger } from '../../src/db/retention.ts';

describe('the ledger\'s indexes', function () {
  this.timeout(30_000);
  let db: TestDatabase;
  let pool: ReturnType<typeof testPool>;

  before(async () => {
    db = await createTestDatabase();
    pool = testPool(db.conn, 2);
  });
  after(async () => {
    await pool?.end();
    await db?.drop();
  });

  /** The key columns of each index on a partition, as `(a, b)`. */
  const indexKeys = async (partition: string): Promise<string[]> => {
    const { rows } = await pool.query<{ def: string }>(
      `SELECT pg_get_indexdef(indexrelid) AS def FROM pg_index WHERE indrelid = ('sarsen.' || $1)::regclass`, [partition]);
    return rows.map((r) => /\((.*?)\)/.exec(r.def)![0]);
  };

  it('a month carries no index by creation time alone; the legacy partition keeps one, and its old rows are swept through it', async () => {
    const partitions = await listPartitions(pool, LEDGER.tables);
    const legacy = partitions.find((p) => p.loMs === null)!;
    const months = partitions.filter((p) => p.loMs !== null);
    expect(months.length).to.be.at.least(1);
    for (const m of months) {
      const keys = await indexKeys(m.name);
      expect(keys, m.name).to.not.include('(created_at)');
      expect(keys, m.name).to.have.length(3); // its key, the billing pages' (tenancy), usage's (namespace, time)
    }
    expect(await indexKeys(legacy.name)).to.include('(created_at)');

    // Entries past a 30-day horizon and one inside it, all in the legacy partition's range.
    const entry = `INSERT INTO sarsen.ledger (tenancy_id, namespace_id, api_key_id, request_id, kind, amount_micros, created_at)
                   VALUES ('ten_probe', 'ns_probe', 'key_probe', $1, 'execution', 0, now() - make_interval(days => $2))`;
    for (const [id, days] of [['req_a', 40], ['req_b', 35], ['req_c', 31], ['req_d', 1]] as const) await pool.query(entry, [id, days]);
    expect(await sweepLedger(pool, 30, 2, legacy.name)).to.equal(2);
    expect(await sweepLedger(pool, 30, 2, legacy.name)).to.equal(1);
    const { rows } = await pool.query(`SELECT request_id FROM sarsen.ledger ORDER BY request_id`);
    expect(rows).to.deep.equal([{ request_id: 'req_d' }]);
  });
});
