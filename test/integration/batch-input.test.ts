// The parameters that batchInput (src/db/columns.ts) generates reach PostgreSQL as the rows
// they came from: every column in its place, binary values cut from their packed data exactly
// (NULL and empty kept apart), the scalars after them.
import { expect } from 'chai';
import type pg from 'pg';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';
import { batchInput } from '../../src/db/columns.ts';

type Row = { id: string; n: number | null; a: Buffer | null; flag: boolean; b: Buffer | null };

const INPUT = batchInput<Row, { shard: number; origin: string }>(
  [
    ['id', 'text', (r) => r.id],
    ['a', 'binary', (r) => r.a],
    ['n', 'bigint', (r) => r.n],
    ['flag', 'boolean', (r) => r.flag],
    ['b', 'binary', (r) => r.b],
  ],
  { shard: 'smallint', origin: 'text' },
);

describe('batch input in PostgreSQL', function () {
  this.timeout(60_000);
  let db: TestDatabase;
  let pool: pg.Pool;
  before(async () => {
    db = await createTestDatabase();
    pool = testPool(db.conn, 1);
  });
  after(async () => {
    await pool?.end();
    await db?.drop();
  });

  it('reads back every row and scalar as given', async () => {
    const rows: Row[] = [
      { id: 'r1', n: 9007199254740991, a: Buffer.from([0, 255, 10]), flag: true, b: null },
      { id: 'say "hi", {x}', n: null, a: null, flag: false, b: Buffer.alloc(0) },
      { id: 'r3', n: -1, a: Buffer.alloc(0), flag: true, b: Buffer.from('\\x00', 'utf8') },
      { id: 'r4', n: 0, a: Buffer.from('last'), flag: false, b: Buffer.from([1]) },
    ];
    const { rows: read } = await pool.query<{ id: string; n: string | null; a: Buffer | null; flag: boolean; b: Buffer | null; ord: string; shard: number; origin: string }>(
      `SELECT r.id, r.n, r.a, r.flag, r.b, r.ord, ${INPUT.param('shard')} AS shard, ${INPUT.param('origin')} AS origin
         FROM (${INPUT.rows}) AS r ORDER BY r.ord`,
      INPUT.values(rows, { shard: 7, origin: 'wrk_x' }),
    );
    expect(read.map((r) => ({ id: r.id, n: r.n === null ? null : Number(r.n), a: r.a, flag: r.flag, b: r.b }))).to.deep.equal(rows);
    expect(read.map((r) => [Number(r.ord), r.shard, r.origin])).to.deep.equal([[1, 7, 'wrk_x'], [2, 7, 'wrk_x'], [3, 7, 'wrk_x'], [4, 7, 'wrk_x']]);
  });
});
