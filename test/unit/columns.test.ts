// The generator of batch statements' parameters (src/db/columns.ts): one table of columns and
// scalars yields both the SQL that reads the parameters and the values, numbered alike.
import { expect } from 'chai';
import { arrayLiteral, batchInput, binarySlice, namedParams, withParts } from '../../src/db/columns.ts';

type Row = { id: string; n: number | null; a: Buffer | null; b: Buffer | null };

const INPUT = batchInput<Row, { shard: number; origin: string }>(
  [
    ['id', 'text', (r) => r.id],
    ['a', 'binary', (r) => r.a],
    ['n', 'int', (r) => r.n],
    ['b', 'binary', (r) => r.b],
  ],
  { shard: 'smallint', origin: 'text' },
);

describe('batch statement parameters', () => {
  it('numbers the columns in order, a binary one by its array of sizes', () => {
    expect(INPUT.unnest('v')).to.equal('unnest($1::text[], $2::int[], $3::int[], $4::int[]) AS v(id, a_size, n, b_size)');
    expect(INPUT.unnest('t', true)).to.equal('unnest($1::text[], $2::int[], $3::int[], $4::int[]) WITH ORDINALITY AS t(id, a_size, n, b_size, ord)');
    expect(INPUT.array('id')).to.equal('$1::text[]');
    expect(INPUT.array('n')).to.equal('$3::int[]');
  });

  it('puts the binary columns\' data after the columns, and the scalars after those, each cast to its type', () => {
    expect(INPUT.rows).to.equal(
      `SELECT t.*, ${binarySlice('$5::bytea', 't.a_size', 't.ord')} AS a, ${binarySlice('$6::bytea', 't.b_size', 't.ord')} AS b\n` +
        '    FROM unnest($1::text[], $2::int[], $3::int[], $4::int[]) WITH ORDINALITY AS t(id, a_size, n, b_size, ord)',
    );
    expect(INPUT.param('shard')).to.equal('$7::smallint');
    expect(INPUT.param('origin')).to.equal('$8::text');
  });

  it('gives the values in the order of their numbers', () => {
    const rows: Row[] = [
      { id: 'r1', n: 1, a: Buffer.from('xy'), b: null },
      { id: 'r"2', n: null, a: null, b: Buffer.alloc(0) },
      { id: 'r3', n: 3, a: Buffer.from('z'), b: Buffer.from('bb') },
    ];
    expect(INPUT.values(rows, { shard: 5, origin: 'wrk_a' })).to.deep.equal([
      arrayLiteral(['r1', 'r"2', 'r3']),
      '{2,-1,1}',
      '{1,NULL,3}',
      '{-1,0,2}',
      Buffer.from('xyz'),
      Buffer.from('bb'),
      5,
      'wrk_a',
    ]);
    expect(INPUT.values([], { shard: 0, origin: 'o' })).to.deep.equal(['{}', '{}', '{}', '{}', Buffer.alloc(0), Buffer.alloc(0), 0, 'o']);
  });

  it('refuses a column it does not have', () => {
    expect(() => INPUT.array('missing')).to.throw('no column missing');
  });

  it('names the parameters of a statement that is not a batch: numbered in order, given by name', () => {
    const params = namedParams<{ id: string; attempt: number; error: string | null }>({ id: 'text', attempt: 'int', error: 'text' });
    expect([params.param('error'), params.param('id'), params.param('attempt')]).to.deep.equal(['$3::text', '$1::text', '$2::int']);
    expect(params.values({ error: null, attempt: 2, id: 'req_x' })).to.deep.equal(['req_x', 2, null]);
  });

  it('joins named parts, in order, into one WITH statement', () => {
    expect(withParts([{ name: 'a', sql: 'SELECT 1 AS x' }, { name: 'b', sql: 'SELECT x FROM a' }], 'SELECT x FROM b')).to.equal(
      'WITH a AS (\n  SELECT 1 AS x\n), b AS (\n  SELECT x FROM a\n)\nSELECT x FROM b',
    );
  });
});
