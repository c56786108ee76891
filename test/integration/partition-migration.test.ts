// Migration 020 on a populated database (issue 28, docs/storage.md): the tables of the release
// before it, filled with 100 days of records, become partitioned tables whose first partition is
// the old table itself: every row and id kept (compared by checksum), nothing copied, and the
// records served, counted, swept and exported as before.
import { expect } from 'chai';
import fs from 'node:fs';
import { runner } from 'node-pg-migrate';
import { createEmptyDatabase, writeSettings, type TestDatabase } from '../support/db.ts';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json } from '../support/http.ts';
import { seedRecords } from '../support/storage-seed.ts';
import { createPool, type Pool } from '../../src/db/pool.ts';
import { migrate, MIGRATIONS_DIR } from '../../src/db/migrate.ts';
import { listPartitions } from '../../src/db/partitions.ts';
import { recountStorage } from '../../src/db/accounting.ts';
import { runRetentionSweep } from '../../src/executor/retention.ts';

const DAY = 86_400_000;
const TABLES = ['requests', 'request_bodies', 'responses', 'chunks', 'ledger', 'request_credentials', 'idempotency_claims', 'usage_rollup', 'key_usage_hourly'];
const KEYS: Record<string, string> = { requests: 'id', request_bodies: 'request_id', responses: 'request_id', chunks: 'request_id, last_seq', ledger: 'id', request_credentials: 'request_id', idempotency_claims: 'request_id', usage_rollup: 'namespace_id, shard', key_usage_hourly: 'namespace_id, hour, api_key_id, shard' };

describe('migration 020 of a populated database', function () {
  this.timeout(180_000);
  let db: TestDatabase;
  let pool: Pool;
  let provider: FakeProvider;
  let server: TestServer;
  let t: Tenant;
  const seeded: Record<string, string> = {};
  const migrated: Record<string, string> = {};
  let migrationMs = 0;

  // Over the columns each table had before (later migrations may add some).
  const columns: Record<string, string> = {};
  const checksums = async (): Promise<Record<string, string>> => {
    const out: Record<string, string> = {};
    for (const table of TABLES) {
      columns[table] ??= (await pool.query(
        `SELECT string_agg(quote_ident(column_name), ', ' ORDER BY ordinal_position) AS c FROM information_schema.columns WHERE table_schema = 'sarsen' AND table_name = $1`,
        [table],
      )).rows[0].c;
      const { rows } = await pool.query(
        `SELECT count(*) || ':' || coalesce(md5(string_agg(row(${columns[table]})::text, '|' ORDER BY ${KEYS[table]})), '') AS sum FROM sarsen.${table}`,
      );
      out[table] = rows[0].sum;
    }
    return out;
  };

  before(async () => {
    provider = await startFakeProvider();
    db = await createEmptyDatabase();
    pool = createPool(db.conn, { max: 3 });
    // The release before: every migration up to 020.
    const earlier = fs.readdirSync(MIGRATIONS_DIR).filter((f) => f.endsWith('.sql') && f < '020').length;
    const client = await pool.connect();
    try {
      await runner({ dbClient: client, dir: MIGRATIONS_DIR, direction: 'up', count: earlier, migrationsSchema: 'sarsen', migrationsTable: 'migrations', createMigrationsSchema: true, checkOrder: true, singleTransaction: true, noLock: true, log: () => {} });
    } finally {
      client.release();
    }
    // 3,000 records over 100 days, some of them still running, with the claims and credentials those hold.
    const target = { tenancyId: 'ten_01ARZ3NDEKTSV4RRFFQ69G5FAV', namespaceId: 'ns_01ARZ3NDEKTSV4RRFFQ69G5FAV', apiKeyIds: ['key_01ARZ3NDEKTSV4RRFFQ69G5FAV'], backendId: 'bk_01ARZ3NDEKTSV4RRFFQ69G5FAV' };
    for (let d = 100; d > 0; d--) await seedRecords(pool, target, 30, Date.now() - d * DAY, DAY);
    await pool.query(`UPDATE sarsen.requests SET status = 'running', finished_at = NULL, lease_owner = 'wrk_gone', lease_expires_at = now() WHERE id IN (SELECT id FROM sarsen.requests ORDER BY id DESC LIMIT 3)`);
    await pool.query(`INSERT INTO sarsen.request_credentials (request_id, sealed) SELECT id, '\\x0102'::bytea FROM sarsen.requests WHERE status = 'running'`);
    await pool.query(`INSERT INTO sarsen.idempotency_claims (namespace_id, identity, request_id, expires_at) SELECT namespace_id, sha256(id::bytea), id, now() + interval '5 minutes' FROM sarsen.requests WHERE status = 'running'`);
    Object.assign(seeded, await checksums());
    const started = performance.now();
    await migrate(db.conn, pool);
    migrationMs = performance.now() - started;
    Object.assign(migrated, await checksums()); // before a server recovers the running ones
    await writeSettings(db.conn, { retention_sweep_interval_ms: 86_400_000 });
    server = await startTestServer({ db });
    t = await provision(server, provider);
  });
  after(async () => {
    await server?.close();
    await pool?.end();
    await db?.drop();
    await provider?.close();
  });

  it('keeps every row and id, the old tables attached as the first partitions', async () => {
    expect(migrated).to.deep.equal(seeded);
    for (const table of ['requests', 'request_bodies', 'responses', 'chunks', 'ledger']) {
      const parts = await listPartitions(pool, [table]);
      expect(parts[0], table).to.include({ name: `${table}_legacy`, lo: null });
      expect(parts.length, table).to.be.greaterThan(1); // and partitions ahead for new rows
    }
    // A new ledger entry continues the old sequence.
    const { rows } = await pool.query(`SELECT max(id) AS n FROM sarsen.ledger`);
    const next = await pool.query(`SELECT nextval('sarsen.ledger_id_seq') AS n`);
    expect(Number(next.rows[0].n)).to.be.greaterThan(Number(rows[0].n));
    process.stderr.write(`      (migration of ${seeded.requests!.split(':')[0]} requests: ${migrationMs.toFixed(0)} ms)\n`);
  });

  it('serves, counts, sweeps and exports the records it kept', async () => {
    // The seeded records become this namespace's (the id decides the partition, the namespace does not).
    for (const table of ['requests', 'ledger', 'usage_rollup', 'key_usage_hourly', 'idempotency_claims']) {
      await pool.query(`UPDATE sarsen.${table} SET namespace_id = $1`, [t.namespaceId]);
    }
    await pool.query(`UPDATE sarsen.requests SET api_key_id = $1`, [t.apiKeyId]);
    const storage = async () => json(await rawRequest(`${t.base}/storage`, { headers: { 'x-sarsen-key': t.key } }));
    expect(await storage()).to.include(await recountStorage(pool, t.namespaceId));

    const { rows: old } = await pool.query(`SELECT q.id, r.body FROM sarsen.requests q JOIN sarsen.responses r ON r.request_id = q.id WHERE q.status = 'succeeded' ORDER BY q.id DESC LIMIT 1`);
    const record = await rawRequest(`${t.base}/requests/${old[0].id}`, { headers: { 'x-sarsen-key': t.key } });
    expect(record.status).to.equal(200);
    expect(JSON.stringify(json(record).response)).to.equal(JSON.stringify(JSON.parse(old[0].body.toString('utf8'))));

    const fresh = json(await rawRequest(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: 'after the migration' }] }),
    })).request_id as string;
    for (;;) {
      const { rows } = await pool.query(`SELECT status FROM sarsen.requests WHERE id = $1`, [fresh]);
      if (rows[0].status === 'succeeded') break;
      await new Promise((r) => setTimeout(r, 20));
    }
    // Past the 90-day horizon: the records in the old table are swept row by row, as before.
    const counts = await runRetentionSweep(server);
    const { rows: gone } = await pool.query(`SELECT count(*) FILTER (WHERE expired)::int AS swept, count(*) FILTER (WHERE NOT expired AND finished_at < now() - interval '90 days')::int AS kept FROM sarsen.requests`);
    expect(gone[0].kept).to.equal(0);
    expect(counts.records).to.equal(gone[0].swept);
    expect(counts.records).to.be.at.least(250);
    expect(await storage()).to.include(await recountStorage(pool, t.namespaceId));

    const exported = (await rawRequest(`${t.base}/requests/export?with_payloads=true`, { headers: { 'x-sarsen-key': t.key } })).body.toString('utf8').trim().split('\n');
    expect(exported).to.have.length(3001);
    expect(JSON.parse(exported[exported.length - 1]!).request_id).to.equal(fresh);
  });
});
