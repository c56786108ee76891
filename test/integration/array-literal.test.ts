// Batch statements pass their columns as array literals built by arrayLiteral (src/db/columns.ts),
// not by pg's encoder: every value must reach PostgreSQL exactly as it was.
import { expect } from 'chai';
import type pg from 'pg';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';
import { arrayLiteral } from '../../src/db/columns.ts';

describe('array literals of batch columns', function () {
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

  it('carries text exactly: quotes, backslashes, separators, braces, spaces, NULL as a word, empty, unicode, JSON bodies', async () => {
    const values = [
      'plain', '', ' leading and trailing ', 'a,b', '{braces}', 'say "hi"', 'back\\slash', '\\"both\\"', 'NULL', 'null',
      'line\nbreak\ttab', 'héllo wörld ✓ 𝄞', '{"model":"gpt","messages":[{"role":"user","content":"a \\"quoted\\" \\\\ word"}]}', null,
    ];
    const { rows } = await pool.query<{ v: (string | null)[] }>('SELECT $1::text[] AS v', [arrayLiteral(values)]);
    expect(rows[0]!.v).to.deep.equal(values);
  });

  it('carries numbers, booleans, nulls and bytes', async () => {
    const bytes = [Buffer.from([0, 1, 2, 255]), Buffer.alloc(0), null, Buffer.from('\\"x', 'utf8')];
    const { rows } = await pool.query<{ i: (number | null)[]; b: (boolean | null)[]; n: string[]; x: (Buffer | null)[] }>(
      'SELECT $1::int[] AS i, $2::boolean[] AS b, $3::bigint[] AS n, $4::bytea[] AS x',
      [arrayLiteral([0, -7, 2147483647, null]), arrayLiteral([true, false, null]), arrayLiteral([9007199254740991, 0]), arrayLiteral(bytes)],
    );
    expect(rows[0]!.i).to.deep.equal([0, -7, 2147483647, null]);
    expect(rows[0]!.b).to.deep.equal([true, false, null]);
    expect(rows[0]!.n).to.deep.equal(['9007199254740991', '0']);
    expect(rows[0]!.x.map((b) => (b === null ? null : b.toString('hex')))).to.deep.equal(bytes.map((b) => (b === null ? null : b.toString('hex'))));
  });

  it('an empty column is an empty array', async () => {
    const { rows } = await pool.query<{ v: string[] }>('SELECT $1::text[] AS v', [arrayLiteral([])]);
    expect(rows[0]!.v).to.deep.equal([]);
  });
});
