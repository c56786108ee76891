// Migration 031 on a database with batches (docs/api.md "Batches"): a line that became a request
// stops copying that request's status, and reads it from the request instead. Every line is kept
// as it was but for that copy, and each reads as its request says, the one whose copy lagged
// (still `running` while its request had ended) included, with no dispatcher round in between.
import { expect } from 'chai';
import fs from 'node:fs';
import { runner } from 'node-pg-migrate';
import { createEmptyDatabase, type TestDatabase } from '../support/db.ts';
import { seedRecords, DEFAULT_SHAPE } from '../support/storage-seed.ts';
import { createPool, type Pool } from '../../src/db/pool.ts';
import { migrate, MIGRATIONS_DIR } from '../../src/db/migrate.ts';
import { findBatch, listLines } from '../../src/db/batches.ts';

const target = { tenancyId: 'ten_01ARZ3NDEKTSV4RRFFQ69G5FAV', namespaceId: 'ns_01ARZ3NDEKTSV4RRFFQ69G5FAV', apiKeyIds: ['key_01ARZ3NDEKTSV4RRFFQ69G5FAV'], backendId: 'bk_01ARZ3NDEKTSV4RRFFQ69G5FAV' };
const BATCH = 'batch_01ARZ3NDEKTSV4RRFFQ69G5FAV';
// Everything of a line but its state, which the migration rewrites for dispatched lines.
const KEPT = `SELECT batch_id, line, custom_id, model, body, request_id, error_code, error_status, error_message FROM sarsen.batch_lines ORDER BY batch_id, line`;

describe('migration 031 of a database with batches', function () {
  this.timeout(120_000);
  let db: TestDatabase;
  let pool: Pool;
  let kept: unknown[];

  before(async () => {
    db = await createEmptyDatabase();
    pool = createPool(db.conn, { max: 3 });
    const earlier = fs.readdirSync(MIGRATIONS_DIR).filter((f) => f.endsWith('.sql') && f < '031').length;
    const client = await pool.connect();
    try {
      await runner({ dbClient: client, dir: MIGRATIONS_DIR, direction: 'up', count: earlier, migrationsSchema: 'sarsen', migrationsTable: 'migrations', createMigrationsSchema: true, checkOrder: true, singleTransaction: true, noLock: true, log: () => {} });
    } finally {
      client.release();
    }
    await seedRecords(pool, target, 5, Date.now() - 3_600_000, 1_800_000, { ...DEFAULT_SHAPE, streamEvery: 1000 });
    const ids = (await pool.query<{ id: string }>(`SELECT id FROM sarsen.requests ORDER BY id`)).rows.map((r) => r.id);
    await pool.query(`UPDATE sarsen.requests SET status = 'failed' WHERE id = $1`, [ids[1]]);
    await pool.query(`UPDATE sarsen.requests SET status = 'running', finished_at = NULL, lease_owner = 'wrk_x', lease_expires_at = now() + interval '1 minute' WHERE id = $1`, [ids[2]]);
    await pool.query(`INSERT INTO sarsen.batches (id, vendor, tenancy_id, namespace_id, api_key_id, dialect, endpoint, completion_window, total, expires_at)
                      VALUES ($1, 'openai', $2, $3, $4, 'chat', '/v1/chat/completions', '24h', 9, now() + interval '1 day')`,
    [BATCH, target.tenancyId, target.namespaceId, target.apiKeyIds[0]]);
    const line = (n: number, state: string, requestId: string | null, more = `NULL, NULL, NULL, NULL`) =>
      pool.query(`INSERT INTO sarsen.batch_lines (batch_id, line, custom_id, state, request_id, body, error_code, error_status, error_message)
                  VALUES ($1, $2, $3, $4, $5, ${more})`, [BATCH, n, `c${n}`, state, requestId]);
    await line(1, 'succeeded', ids[0]!);
    await line(2, 'failed', ids[1]!);
    await line(3, 'running', ids[2]!);
    await line(4, 'running', ids[3]!); // its request ended; the copy had not caught up yet
    await line(5, 'succeeded', ids[4]!);
    await line(6, 'refused', null, `NULL, 'not_found', 404, 'No routing rule matches.'`);
    await line(7, 'waiting', null, `'{"model":"m"}', NULL, NULL, NULL`);
    await line(8, 'canceled', null);
    await line(9, 'expired', null);
    kept = (await pool.query(KEPT)).rows;
    await migrate(db.conn, pool);
  });
  after(async () => {
    await pool?.end();
    await db?.drop();
  });

  it('keeps every line, and each reads its state from its request', async () => {
    expect((await pool.query(KEPT)).rows).to.deep.equal(kept);
    const own = (await pool.query<{ line: number; state: string }>(`SELECT line, state FROM sarsen.batch_lines ORDER BY line`)).rows.map((r) => r.state);
    expect(own).to.deep.equal(['dispatched', 'dispatched', 'dispatched', 'dispatched', 'dispatched', 'refused', 'waiting', 'canceled', 'expired']);
    const read = (await listLines(pool, BATCH, 0, 100)).map((l) => l.state);
    expect(read).to.deep.equal(['succeeded', 'failed', 'running', 'succeeded', 'succeeded', 'refused', 'waiting', 'canceled', 'expired']);
    const batch = await findBatch(pool, target.namespaceId, BATCH, 'openai');
    expect(batch!.counts).to.deep.equal({ waiting: 1, running: 1, succeeded: 3, failed: 1, refused: 1, canceled: 1, expired: 1 });
  });
});
