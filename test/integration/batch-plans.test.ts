// The group-commit writers' statements are planned once per connection (generic plans, see
// src/db/pool.ts), usually while the tables are small. A plan that reached a table by a
// sequential scan then, or read a whole index to find a batch's rows, would keep doing so once
// the table held a backlog of tens of thousands of rows (the backstop jobs of every running
// request, the requests themselves), for as long as nothing replans it (with autovacuum off,
// never). Whatever the tables held when the plans were made, no table is read by a sequential
// scan, and the tables that grow with traffic are read through an index condition, never by
// reading an index whole.
import { expect } from 'chai';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { track } from '../support/resources.ts';
import { createBatchPool, type Pool } from '../../src/db/pool.ts';
import { submitBatch, type NewRequest } from '../../src/db/submissions.ts';
import { newId } from '../../src/core/ids.ts';
import { claimAttempts, renewLeases, settleBatch } from '../../src/db/attempts.ts';
import { storeFrames } from '../../src/db/chunks.ts';
import { cancelledAnswer } from '../../src/db/cancel.ts';

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

  /** A submission of one shape: with rate limits and with the response cache, or not. */
  const submission = (shape: { limits: boolean; cache: boolean }): NewRequest => ({
    id: newId('req'), tenancyId: 'ten_probe', namespaceId: 'ns_probe', apiKeyId: 'key_probe', backendId: 'bk_probe', fallbackBackendIds: [],
    dialect: 'chat', streaming: false, model: 'm', upstreamModel: 'm', forwardedHeaders: [], hops: 0, body: '{}',
    identity: Buffer.from(newId('req')), sealedCredential: null, owner: null, precounted: false,
    limits: shape.limits ? { requestsPerMinute: 1000, tokensPerMinute: 1000 } : null,
    cache: shape.cache ? { key: Buffer.from(newId('req')), lifeMs: 60_000, store: true } : null,
  });

  // Tables (and their partitions) that grow with every request, as opposed to the control plane's.
  const GROWS = /^(requests|request_bodies|request_credentials|responses|chunks|ledger|idempotency_claims|key_usage_hourly|_private_jobs)(_|$)/;

  /** The generic plan of a statement prepared on the probe's connection, line by line. */
  const planOf = async (r: { name: string; types: string[] }): Promise<string[]> =>
    (await pool.query<{ 'QUERY PLAN': string }>(`EXPLAIN EXECUTE ${r.name}(${r.types.map((t) => `NULL::${t}`).join(', ')})`)).rows.map((p) => p['QUERY PLAN']);

  /** What the batch statements' plans read badly, as `statement: what`. */
  const badReads = async (): Promise<string[]> => {
    await submitBatch(pool, [], { windowMs: 600_000, feeMicros: 0, leaseMs: 30_000 });
    // Every other shape of the submission statement (each with one submission of its kind).
    for (const shape of [{ limits: true, cache: false }, { limits: false, cache: true }, { limits: true, cache: true }]) {
      await submitBatch(pool, [submission(shape)], { windowMs: 600_000, feeMicros: 0, leaseMs: 30_000 });
    }
    await claimAttempts(pool, [], 'wrk_probe', 30_000);
    await renewLeases(pool, [], 30_000);
    // Every shape of the terminal write (a terminal for no request writes nothing).
    const failure = {
      id: 'req_none', attempt: 1, model: 'm', answer: cancelledAnswer(), tokens: { prompt: null, completion: null, total: null }, frames: null,
      reached: false, sentBytes: 0, receivedBytes: 0, cancelled: true, end: { status: null, retryAfter: null, error: null }, ownCredential: true,
      tokenLimited: false, cacheable: false,
    };
    for (const metering of [false, true]) {
      for (const ts of [[], [failure], [{ ...failure, ownCredential: false, tokenLimited: true, cacheable: true, answer: { ...failure.answer, status: 'succeeded' as const } }], [{ ...failure, tokenLimited: true }]]) {
        await settleBatch(pool, ts, { metering, origin: 'wrk_probe' });
      }
    }
    await storeFrames(pool, [], 'wrk_probe');
    const { rows } = await pool.query<{ name: string; types: string[] }>(
      `SELECT name, parameter_types::text[] AS types FROM pg_prepared_statements WHERE name LIKE 'sarsen\\_%' ORDER BY name`,
    );
    expect(rows.map((r) => r.name)).to.include.members(['sarsen_submit_batch', 'sarsen_submit_batch_limited', 'sarsen_submit_batch_cached',
      'sarsen_submit_batch_limited_cached', 'sarsen_claim_batch', 'sarsen_renew_leases', 'sarsen_settle_batch', 'sarsen_settle_batch_cleanup',
      'sarsen_settle_batch_metered', 'sarsen_settle_batch_metered_cleanup', 'sarsen_settle_batch_limited', 'sarsen_settle_batch_cleanup_limited',
      'sarsen_settle_batch_metered_limited', 'sarsen_settle_batch_metered_cleanup_limited', 'sarsen_store_frames']);
    const bad: string[] = [];
    for (const r of rows) {
      const lines = await planOf(r);
      lines.forEach((line, i) => {
        const seq = /Seq Scan on (\S+)/.exec(line);
        if (seq) bad.push(`${r.name}: sequential scan of ${seq[1]}`);
        // An index read without a condition (plain or index-only) reads that index whole: of a
        // table that grows with traffic, or one of its partitions, never.
        const byIndex = /Index (?:Only )?Scan (?:Backward )?using (\S+) on (\S+)/.exec(line);
        if (byIndex && GROWS.test(byIndex[2]!) && !/Index Cond:/.test(lines[i + 1] ?? '')) bad.push(`${r.name}: all of ${byIndex[1]} on ${byIndex[2]}`);
      });
    }
    return bad;
  };

  it('read no table whole, planned over empty tables never analysed (a new deployment, autovacuum off)', async () => {
    expect(await badReads()).to.deep.equal([]);
  });

  // A terminal write prices tokens by the model it is handed: it reads the request rows only as
  // its update does, once per partition, not again per answer to find the model.
  it('the terminal write reads the requests only to update them', async () => {
    await badReads(); // every shape prepared on this connection
    const { rows } = await pool.query<{ name: string; types: string[] }>(
      `SELECT name, parameter_types::text[] AS types FROM pg_prepared_statements WHERE name LIKE 'sarsen\\_settle\\_batch%' ORDER BY name`,
    );
    expect(rows).to.have.length(8);
    for (const r of rows) {
      const plan = await planOf(r);
      const updated = plan.filter((line) => /Update on requests_\w+/.test(line)).length;
      const scans = plan.filter((line) => /(?:Seq Scan|Bitmap Heap Scan|Index (?:Only )?Scan (?:Backward )?using \S+) on requests_\w+/.test(line)).length;
      expect(updated, r.name).to.be.greaterThan(0);
      expect(scans, `${r.name}: scans of request partitions`).to.equal(updated);
    }
  });

  it('read no table whole, planned over small tables analysed (autovacuum in a deployment\'s first minutes)', async () => {
    await pool.query(`SELECT graphile_worker.add_job('execute_request', json_build_object('n', n)) FROM generate_series(1, 3) AS n`);
    await pool.query('ANALYZE');
    expect(await badReads()).to.deep.equal([]);
  });
});
