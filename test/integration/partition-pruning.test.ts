// Batch statements on partitioned tables prune at executor start (migration 027, docs/storage.md
// "Cost of many partitions"). The claim, the lease renewal, every shape of the terminal write, the
// flush of frames, the recovery's requeue and the export's reads name their rows by an array of
// request ids; their generic plans would open and probe every partition of the tables they read,
// and a deployment keeps about 90 of the payload tables'. Here, on a database with 90 days of
// partitions made ahead, each statement's plan (as a prepared statement runs it) scans none of
// those below its oldest id, and each partition by an index the id leads; and the statements still
// find rows whose ids fall in different partitions.
import { expect } from 'chai';
import pg from 'pg';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { createBatchPool, type Pool } from '../../src/db/pool.ts';
import { ENSURE_TASK_SQL } from '../../src/db/jobs.ts';
import { ensurePartitions, listPartitions, type Partition } from '../../src/db/partitions.ts';
import { submitBatch, isRefused, type NewRequest } from '../../src/db/submissions.ts';
import { ATTEMPT_SQL, claimAttempts, renewLeases, settleBatch, type Terminal } from '../../src/db/attempts.ts';
import { wholeFrame } from '../../src/core/frame-delta.ts';
import { FRAME_SQL, storeFrames } from '../../src/db/chunks.ts';
import { RECOVERY_SQL } from '../../src/db/recovery.ts';
import { payloads, frameRows } from '../../src/db/export.ts';
import { firstIdAt, newId } from '../../src/core/ids.ts';

const DAY = 86_400_000;
const PARTITIONED = ['requests', 'request_bodies', 'responses', 'chunks'];

type PlanNode = { 'Node Type': string; 'Relation Name'?: string; 'Index Name'?: string; Plans?: PlanNode[] };

/** Every relation a plan scans (a partition by its own name), and every index it scans by. */
function scanned(node: PlanNode, into = { relations: [] as string[], indexes: [] as string[] }): typeof into {
  if (node['Node Type'].endsWith('Scan') && node['Relation Name']) into.relations.push(node['Relation Name']);
  if (node['Index Name']) into.indexes.push(node['Index Name']);
  for (const child of node.Plans ?? []) scanned(child, into);
  return into;
}
const partitionOf = (name: string) => PARTITIONED.some((t) => name.startsWith(`${t}_`));

/** A request id made at `ms`, distinct from any other (its random part from a fresh id). */
const idAt = (ms: number): string => firstIdAt('req', ms).slice(0, -16) + newId('req').slice(-16);

describe('batch statements on partitioned tables', function () {
  this.timeout(120_000);
  let db: TestDatabase;
  let pool: Pool;
  let partitions: Partition[];
  // Ids in two partitions of the payloads: as made 80 and 82 days from now, when the 80 days of
  // partitions before them hold older records.
  const ids = [idAt(Date.now() + 80 * DAY), idAt(Date.now() + 82 * DAY)];

  before(async () => {
    db = await createTestDatabase();
    pool = createBatchPool(db.conn, 'sarsen-pruning-test', 1);
    await pool.query(ENSURE_TASK_SQL);
    for (let day = 1; day <= 90; day++) await ensurePartitions(pool, Date.now() + day * DAY);
    partitions = await listPartitions(pool, PARTITIONED);
  });
  after(async () => {
    await pool?.end();
    await db?.drop();
  });

  /** The partitions wholly below the ids' least (the test database's collation is C). */
  const below = (): Set<string> => {
    const least = ids.reduce((a, b) => (a < b ? a : b));
    return new Set(partitions.filter((p) => p.hi.replace(/^'|'$/g, '') <= least).map((p) => p.name));
  };

  /** The text of the statement `read` sends (answering no rows). */
  const textOf = async (read: (db: Pick<Pool, 'query'>) => Promise<unknown>): Promise<string> => {
    let text = '';
    await read({ query: (async (sql: string) => ((text = sql), { rows: [] })) as unknown as Pool['query'] });
    return text;
  };
  const statements: Record<string, string> = {
    ...ATTEMPT_SQL, ...FRAME_SQL, ...RECOVERY_SQL,
    export_payloads: '', export_frames: '', // (filled in before the tests run)
  };
  before(async () => {
    statements.export_payloads = await textOf((d) => payloads(d, ids, 1024));
    statements.export_frames = await textOf((d) => frameRows(d, ids, null, 10));
  });
  for (const name of Object.keys(statements)) {
    it(`${name} scans no partition below its oldest id, each by an index its ids lead`, async () => {
      const text = statements[name]!;
      expect(partitions.filter((p) => p.table === 'request_bodies').length).to.be.greaterThan(90);
      // Planned as Sarsen's prepared statements are (generic plans), executed by nothing: the
      // pruning at executor start is what EXPLAIN shows. Every batch statement's first
      // parameter is its ids (an EXECUTE takes literals); the others stay null.
      const params = Math.max(...[...text.matchAll(/\$(\d+)/g)].map((m) => Number(m[1])));
      const client = new pg.Client(db.conn);
      await client.connect();
      try {
        await client.query('SET plan_cache_mode = force_generic_plan');
        await client.query(`PREPARE s AS ${text}`);
        const args = [client.escapeLiteral(`{${ids.join(',')}}`), ...Array.from({ length: params - 1 }, () => 'NULL')].join(', ');
        const { rows } = await client.query<{ 'QUERY PLAN': [{ Plan: PlanNode }] }>(`EXPLAIN (FORMAT JSON) EXECUTE s(${args})`);
        const { relations, indexes } = scanned(rows[0]!['QUERY PLAN'][0].Plan);
        const found = relations.filter(partitionOf);
        expect(found, `${name} scans no partitioned table`).to.not.deep.equal([]);
        const pruned = below();
        expect(pruned.size).to.be.greaterThan(80);
        expect(found.filter((r) => pruned.has(r)), `${name} scans partitions below its oldest id`).to.deep.equal([]);
        // Each partition by an index its ids lead: the bound must not lead the planner to walk
        // an index led by another column (a generic plan keeps its choice while the table grows).
        const { rows: leads } = await client.query<{ index: string; lead: string }>(
          `SELECT c.relname AS index, a.attname AS lead FROM pg_class c JOIN pg_index x ON x.indexrelid = c.oid
             JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0] WHERE c.relname = ANY($1::text[])`,
          [indexes.filter(partitionOf)],
        );
        expect(leads.filter((l) => l.lead !== 'id' && l.lead !== 'request_id'), `${name} scans a partition by an index another column leads`).to.deep.equal([]);
      } finally {
        await client.end();
      }
    });
  }

  it('bounds by the least id of an array, and by nothing (the empty string) for none', async () => {
    const { rows } = await pool.query<Record<string, string>>(
      `SELECT sarsen.least_id($1::text[]) AS ids, sarsen.least_id(NULL) AS "null", sarsen.least_id('{}') AS empty, sarsen.least_id('{NULL,NULL}') AS nulls,
              sarsen.least_id(ARRAY[NULL, $2, $3]) AS mixed`,
      [[...ids].reverse(), ids[1], ids[0]],
    );
    expect(rows[0]).to.deep.equal({ ids: ids[0], null: '', empty: '', nulls: '', mixed: ids[0] });
  });

  it('claims, renews, stores frames of and settles requests whose ids fall in different partitions, in one batch each', async () => {
    const submissions: NewRequest[] = ids.map((id) => ({
      id, tenancyId: 'ten_p', namespaceId: 'ns_p', apiKeyId: 'key_p', backendId: 'bk_p', fallbackBackendIds: [], dialect: 'chat', streaming: true,
      model: 'm', upstreamModel: 'm', forwardedHeaders: [], hops: 0, body: `{"model":"m","n":"${id}"}`, identity: Buffer.from(id),
      sealedCredential: null, owner: null, precounted: false, limits: null, cache: null,
    }));
    const accepted = await submitBatch(pool, submissions, { windowMs: 600_000, feeMicros: 0, leaseMs: 30_000 });
    expect(accepted.map((a) => (a === null || isRefused(a) ? null : a.requestId))).to.deep.equal(ids);
    const claimed = await claimAttempts(pool, ids, 'wrk_p', 30_000);
    expect([...claimed.keys()].sort()).to.deep.equal([...ids].sort());
    const renewed = await renewLeases(pool, ids.map((id) => ({ id, attempt: 1 })), 30_000);
    expect([...renewed.keys()].sort()).to.deep.equal([...ids].sort());
    const stored = await storeFrames(pool, ids.map((id) => { const frame = Buffer.from(`data: ${id}\n\n`); return { requestId: id, attempt: 1, seq: 1, frame, stored: wholeFrame(frame) }; }), 'wrk_p');
    expect([...stored.keys()].sort()).to.deep.equal([...ids].sort());
    const answer = Buffer.from('{}');
    const settled = await settleBatch(pool, ids.map((id): Terminal => ({
      id, attempt: 1, model: 'm',
      answer: { status: 'succeeded', httpStatus: 200, contentType: 'text/event-stream', body: answer, errorStatus: null, retryAfter: null },
      tokens: { prompt: null, completion: null, total: null }, frames: { bytes: 20, lastSeq: 1 }, reached: true, sentBytes: 10, receivedBytes: 20,
      cancelled: false, end: { status: 200, retryAfter: null, error: null }, ownCredential: false, tokenLimited: false, cacheable: false,
    })), { metering: false, origin: 'wrk_p' });
    expect([...settled].sort()).to.deep.equal([...ids].sort());
    const { rows } = await pool.query<{ id: string; status: string }>(`SELECT id, status FROM sarsen.requests WHERE id = ANY($1::text[]) ORDER BY id`, [ids]);
    expect(rows.map((r) => r.status)).to.deep.equal(['succeeded', 'succeeded']);
  });
});
