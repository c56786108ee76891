// The storage benchmark (issue 28; docs/storage.md): a namespace holding --requests records over
// --days days (2 KB bodies, 1 KB answers, one in five streamed with 100 frames), in daily payload
// partitions, on a durable database. It measures:
//   - retiring one day of payloads by today's row sweep (DELETE, in the executor's batches of 500)
//     against dropping its partitions: time, WAL written, dead tuples left;
//   - concurrent traffic (non-streaming, --concurrency) with no retirement, during a DELETE
//     retirement, and during a DROP: throughput, p99, and the slowest request of each;
//   - reads over HTTP: listing page 1 and 100, GET /usage (30 and 61 days), GET /storage, a record;
//   - table and index bytes per request, and after each of --cycles retention cycles (a day
//     written at the head, the oldest day dropped);
//   - `sarsen export --with-payloads` of the newest --export-records records: records/s, peak RSS;
//   - with --migration-requests N: migration 020 of a database of N records in the layout before it.
// Seeding writes each day with one set-based INSERT ... SELECT in the database (test/support/
// storage-seed.ts): the rows are made where they are stored, not sent over a socket.
//
// Run: npm run bench:storage -- --requests 100000 [--days 90] [--concurrency 16] [--seconds 20]
//        [--cycles 3] [--export-records 100000] [--export-out /dev/null] [--migration-requests 0]
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Pool as HttpPool } from 'undici';
import type pg from 'pg';
import { runner } from 'node-pg-migrate';
import { shutdownDatabases, createEmptyDatabase } from '../test/support/db.ts';
import { spawnNode, type SarsenChild } from '../test/support/child.ts';
import { seedRecords, type SeedTarget } from '../test/support/storage-seed.ts';
import { benchDatabase } from './lib/database.ts';
import { startBenchSarsen, compiledMain, type BenchSarsen } from './lib/sarsen-child.ts';
import { provisionAccounts } from './lib/accounts-seed.ts';
import { percentile, fmt, table } from './lib/stats.ts';
import { createPool } from '../src/db/pool.ts';
import { migrate, MIGRATIONS_DIR } from '../src/db/migrate.ts';
import { ensurePartitions, listPartitions, retirePayloads, retiredBelow, PAYLOADS } from '../src/db/partitions.ts';
import { sweepRecords } from '../src/db/retention.ts';
import { firstIdAt, idTime } from '../src/core/ids.ts';
import { floorTo } from '../src/core/partitions.ts';
import { benchArgs } from './lib/args.ts';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const DAY = 86_400_000;
const args = benchArgs({
  requests: { type: 'string', default: '100000' },
  days: { type: 'string', default: '90' },
  concurrency: { type: 'string', default: '16' },
  seconds: { type: 'string', default: '20' },
  samples: { type: 'string', default: '100' },
  cycles: { type: 'string', default: '3' },
  'export-records': { type: 'string', default: '100000' },
  'export-out': { type: 'string', default: '/dev/null' },
  'migration-requests': { type: 'string', default: '0' },
  'allow-non-durable': { type: 'boolean', default: false },
});
const N = Number(args.requests);
const DAYS = Number(args.days);
const C = Number(args.concurrency);
const SECONDS = Number(args.seconds);
const SAMPLES = Number(args.samples);
const CYCLES = Number(args.cycles);
const EXPORT_RECORDS = Number(args['export-records']);
const MIGRATION_N = Number(args['migration-requests']);
const PER_DAY = Math.round(N / DAYS);

const out = (line = '') => process.stdout.write(line + '\n');
const progress = (line: string) => process.stderr.write(`[bench] ${line}\n`);

const TABLES = ['requests', 'request_bodies', 'responses', 'chunks', 'ledger'];

/** Bytes of the tables that grow with traffic: heap, TOAST and indexes of every partition. */
async function storedBytes(pool: pg.Pool): Promise<number> {
  const { rows } = await pool.query(
    `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint AS n FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
      WHERE s.nspname = 'sarsen' AND c.relkind = 'r' AND c.relname ~ $1`,
    [`^(${TABLES.join('|')})(_|$)`],
  );
  return Number(rows[0].n);
}

/** Dead tuples in those tables and their TOAST tables, once the statistics are flushed. */
async function deadTuples(pool: pg.Pool): Promise<number> {
  await new Promise((r) => setTimeout(r, 1500)); // backends flush their counts at most every second
  const { rows } = await pool.query(
    `SELECT pg_stat_clear_snapshot(), (SELECT coalesce(sum(t.n_dead_tup), 0)::bigint FROM pg_stat_all_tables t
      WHERE t.relid IN (SELECT c.oid FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = 'sarsen' AND c.relname ~ $1
                        UNION SELECT c.reltoastrelid FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = 'sarsen' AND c.relname ~ $1)) AS n`,
    [`^(${TABLES.join('|')})(_|$)`],
  );
  return Number(rows[0].n);
}

const lsn = async (pool: pg.Pool) => (await pool.query<{ l: string }>('SELECT pg_current_wal_lsn()::text AS l')).rows[0]!.l;
const walSince = async (pool: pg.Pool, from: string) => Number((await pool.query(`SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn) AS n`, [from])).rows[0].n);

type Retirement = { how: string; records: number; ms: number; wal: number; dead: number };

/** Today's path: the row sweep over one day's ids, batch after batch of 500 as the executor runs it. */
async function retireByDelete(pool: pg.Pool, target: SeedTarget, dayStart: number, quiet = true): Promise<Retirement> {
  const dead0 = quiet ? await deadTuples(pool) : 0;
  const wal0 = await lsn(pool);
  const t0 = performance.now();
  const minutes = Math.floor((Date.now() - dayStart - DAY) / 60_000) - 1;
  let records = 0;
  const ids = { from: firstIdAt('req', dayStart), fromMs: dayStart, below: firstIdAt('req', dayStart + DAY) };
  for (let n = 500; n === 500; records += n) n = await sweepRecords(pool, target.namespaceId, minutes, 500, ids);
  const ms = performance.now() - t0;
  return { how: 'DELETE (row sweep, batches of 500)', records, ms, wal: await walSince(pool, wal0), dead: quiet ? (await deadTuples(pool)) - dead0 : NaN };
}

/** The new path: the oldest day's partitions dropped (src/db/partitions.ts). */
async function retireByDrop(pool: pg.Pool, target: SeedTarget, quiet = true): Promise<Retirement> {
  const [oldest] = await listPartitions(pool, PAYLOADS.tables);
  const { rows } = await pool.query(`SELECT count(*)::int AS n FROM sarsen.requests WHERE id >= $1 AND id < $2 AND NOT expired`, [oldest!.lo ?? '', oldest!.hi]);
  const minutes = Math.floor((Date.now() - oldest!.hiMs) / 60_000) - 1;
  const dead0 = quiet ? await deadTuples(pool) : 0;
  const client = await pool.connect();
  try {
    const wal0 = await lsn(pool);
    const t0 = performance.now();
    const days = await retirePayloads(client, [{ namespace_id: target.namespaceId, minutes }], minutes, 1);
    const ms = performance.now() - t0;
    if (days !== 1) throw new Error('the oldest day was not dropped');
    return { how: 'DROP (its partitions detached and dropped)', records: rows[0].n, ms, wal: await walSince(pool, wal0), dead: quiet ? (await deadTuples(pool)) - dead0 : NaN };
  } finally {
    client.release();
  }
}

type Traffic = { name: string; rate: number; p50: number; p99: number; max: number; duringMax: number; retireMs: number };

/** Closed-loop non-streaming traffic for SECONDS, with `retire` started a quarter of the way in. */
async function traffic(name: string, origin: string, basePath: string, key: string, retire: (() => Promise<unknown>) | null): Promise<Traffic> {
  const pool = new HttpPool(origin, { connections: C, pipelining: 1, keepAliveTimeout: 60_000 });
  const done: [number, number][] = [];
  let n = 0;
  const warm = performance.now() + 2000;
  const end = warm + SECONDS * 1000;
  let window: [number, number] = [0, 0];
  const retiring = (async () => {
    if (!retire) return;
    await new Promise((r) => setTimeout(r, 2000 + (SECONDS * 1000) / 4));
    window = [performance.now(), 0];
    await retire();
    window[1] = performance.now();
  })();
  const worker = async () => {
    while (performance.now() < end) {
      const sent = performance.now();
      const res = await pool.request({ method: 'POST', path: `${basePath}/chat/completions`, headers: { 'content-type': 'application/json', 'x-sarsen-key': key }, body: `{"model":"gpt-bench","messages":[{"role":"user","content":"storage ${process.pid} ${++n}"}]}` });
      await res.body.arrayBuffer();
      if (res.statusCode !== 200) throw new Error(`traffic answered ${res.statusCode}`);
      if (sent >= warm) done.push([sent, performance.now()]);
    }
  };
  await Promise.all([...Array.from({ length: C }, worker), retiring]);
  await pool.close();
  const lat = Float64Array.from(done.map(([s, e]) => e - s)).sort();
  const during = done.filter(([s, e]) => e >= window[0] && s <= window[1]).map(([s, e]) => e - s);
  return { name, rate: done.length / SECONDS, p50: percentile(lat, 50), p99: percentile(lat, 99), max: lat[lat.length - 1] ?? NaN, duringMax: during.length ? Math.max(...during) : NaN, retireMs: window[1] - window[0] };
}

type Read = { name: string; p50: number; p99: number };

async function reads(origin: string, basePath: string, key: string, recordId: string): Promise<Read[]> {
  const http = new HttpPool(origin, { connections: 1, keepAliveTimeout: 60_000 });
  const get = async (p: string) => {
    const t0 = performance.now();
    const res = await http.request({ method: 'GET', path: p, headers: { 'x-sarsen-key': key } });
    const text = await res.body.text();
    if (res.statusCode !== 200) throw new Error(`GET ${p}: ${res.statusCode} ${text.slice(0, 200)}`);
    return { ms: performance.now() - t0, body: JSON.parse(text) };
  };
  let cursor: string | null = null;
  for (let page = 1; page < 100; page++) cursor = (await get(`${basePath}/requests?limit=50${cursor ? `&after=${encodeURIComponent(cursor)}` : ''}`)).body.next_after;
  const cases: [string, string][] = [
    ['listing page 1', `${basePath}/requests?limit=50`],
    ['listing page 100', `${basePath}/requests?limit=50&after=${encodeURIComponent(cursor!)}`],
    ['GET /usage (30 days)', `${basePath}/usage`],
    ['GET /usage (61 days)', `${basePath}/usage?since=${Date.now() - 61 * DAY}`],
    ['GET /storage', `${basePath}/storage`],
    ['GET /requests/{id}', `${basePath}/requests/${recordId}`],
  ];
  const result: Read[] = [];
  for (const [name, p] of cases) {
    const ms: number[] = [];
    for (let i = 0; i < 20 + SAMPLES; i++) {
      const r = await get(p);
      if (i >= 20) ms.push(r.ms);
    }
    const sorted = Float64Array.from(ms).sort();
    result.push({ name, p50: percentile(sorted, 50), p99: percentile(sorted, 99) });
  }
  await http.close();
  return result;
}

/** `sarsen export --with-payloads` of the records made since `sinceMs`, as a child process: records/s and its peak RSS. */
async function exportRun(url: string, t: { tenancy: string; namespace: string; key: string }, sinceMs: number): Promise<{ records: number; ms: number; rssMb: number }> {
  const outFile = args['export-out'];
  if (outFile !== '/dev/null') fs.rmSync(outFile, { force: true });
  const t0 = performance.now();
  const child: SarsenChild = spawnNode(compiledMain(), ['export', '--tenancy', t.tenancy, '--namespace', t.namespace, '--since', String(sinceMs), '--with-payloads', '--url', url, '--out', outFile], { ...process.env, SARSEN_API_KEY: t.key }, 'export');
  let peakKb = 0;
  const sampler = setInterval(() => {
    try {
      const m = /VmHWM:\s+(\d+)/.exec(fs.readFileSync(`/proc/${child.child.pid}/status`, 'utf8'));
      if (m) peakKb = Math.max(peakKb, Number(m[1]));
    } catch {
      // gone
    }
  }, 100);
  const exit = await child.exited;
  clearInterval(sampler);
  const ms = performance.now() - t0;
  const m = /exported (\d+) records/.exec(child.output());
  if (exit.code !== 0 || !m) throw new Error(`export failed: ${child.output().slice(-500)}`);
  return { records: Number(m[1]), ms, rssMb: peakKb / 1024 };
}

/** Migration 020 of a database of `n` records in the layout before it. */
async function migration(n: number): Promise<{ ms: number; bytes: number }> {
  const db = await createEmptyDatabase();
  const pool = createPool(db.conn, { max: 2, name: 'sarsen-bench' });
  try {
    const earlier = fs.readdirSync(MIGRATIONS_DIR).filter((f) => f.endsWith('.sql') && f < '020').length;
    const client = await pool.connect();
    try {
      await runner({ dbClient: client, dir: MIGRATIONS_DIR, direction: 'up', count: earlier, migrationsSchema: 'sarsen', migrationsTable: 'migrations', createMigrationsSchema: true, checkOrder: true, singleTransaction: true, noLock: true, log: () => {} });
    } finally {
      client.release();
    }
    const target = { tenancyId: 'ten_01ARZ3NDEKTSV4RRFFQ69G5FAV', namespaceId: 'ns_01ARZ3NDEKTSV4RRFFQ69G5FAV', apiKeyIds: ['key_01ARZ3NDEKTSV4RRFFQ69G5FAV'], backendId: 'bk_01ARZ3NDEKTSV4RRFFQ69G5FAV' };
    for (let d = DAYS; d > 0; d--) {
      if (d % 10 === 0) progress(`migration: seeding the old layout, ${d} days to go`);
      await seedRecords(pool, target, Math.round(n / DAYS), Date.now() - d * DAY, DAY);
    }
    await pool.query('VACUUM ANALYZE');
    const bytes = await storedBytes(pool);
    progress('migration: running migration 020');
    const t0 = performance.now();
    await migrate(db.conn, pool);
    return { ms: performance.now() - t0, bytes };
  } finally {
    await pool.end();
    await db.drop();
  }
}

async function main(): Promise<void> {
  const dbInfo = await benchDatabase({ allowNonDurable: args['allow-non-durable'] });
  out(`Sarsen storage benchmark — ${new Date().toISOString()}`);
  out(`machine: ${os.cpus().length} × ${os.cpus()[0]?.model ?? '?'}, load ${os.loadavg().map((l) => fmt(l, 2)).join(' ')}; node ${process.version}`);
  out(`database: ${dbInfo.describe}`);
  if (N > 0) out(`seed: ${N.toLocaleString('en')} requests over ${DAYS} days (${PER_DAY.toLocaleString('en')} a day): 2 KB bodies, 1 KB answers, one in five streamed with 100 frames`);
  out();
  if (MIGRATION_N > 0) {
    const m = await migration(MIGRATION_N);
    out(`Migration 020 of ${MIGRATION_N.toLocaleString('en')} requests (${fmt(m.bytes / 2 ** 30, 2)} GB in the tables before): ${fmt(m.ms / 1000, 2)} s, in one transaction holding its tables' locks (Sarsen does not serve meanwhile)`);
    out();
  }
  if (N === 0) return void (await shutdownDatabases()); // the migration alone
  const provider = spawnNode(path.join(HERE, 'lib/provider-process.ts'), [], process.env, 'bench provider');
  const [, providerUrl] = await provider.waitFor(/listening (http:\S+)/, 30_000);
  let sarsen: BenchSarsen | null = null;
  let pool: pg.Pool | null = null;
  try {
    sarsen = await startBenchSarsen({ settings: { retention_sweep_interval_ms: 86_400_000, metadata_horizon_minutes: (DAYS + 5) * 24 * 60 } });
    pool = createPool(sarsen.db.conn, { max: 4, name: 'sarsen-bench' });
    const { main: t, neighbour } = await provisionAccounts(sarsen.url, pool, providerUrl!, 1);
    const origin = new URL(sarsen.url).origin;
    const key = t.keys[0]!.key;
    // The hot path on a new deployment's few partitions (in the neighbour namespace, whose rows
    // go with them below), against the same after DAYS days of them.
    progress('traffic on a new deployment');
    await traffic('warm-up', origin, neighbour.basePath, neighbour.keys[0]!.key, null);
    const partitionsAtStart = (await listPartitions(pool, PAYLOADS.tables)).length / PAYLOADS.tables.length;
    const fresh = await traffic(`new deployment (${partitionsAtStart} payload partitions)`, origin, neighbour.basePath, neighbour.keys[0]!.key, null);
    // A deployment DAYS days into partitions: the first partitions replaced by days.
    for (const p of await listPartitions(pool, [...PAYLOADS.tables, 'requests', 'ledger'])) {
      await pool.query(`ALTER TABLE sarsen.${p.table} DETACH PARTITION sarsen.${p.name}`);
      await pool.query(`DROP TABLE sarsen.${p.name}`);
    }
    const first = floorTo(Date.now() - DAYS * DAY, 'day');
    for (let t = first; t <= Date.now(); t += DAY) await ensurePartitions(pool, t);
    const target: SeedTarget = { tenancyId: t.tenancyId, namespaceId: t.namespaceId, apiKeyIds: [t.keys[0]!.apiKeyId], backendId: t.backendId };
    const seed0 = performance.now();
    for (let d = 0; d < DAYS; d++) {
      if (d % 10 === 0) progress(`seeding day ${d + 1} of ${DAYS}`);
      await seedRecords(pool, target, PER_DAY, first + d * DAY, DAY);
    }
    progress('VACUUM ANALYZE');
    await pool.query('VACUUM ANALYZE');
    const held = Number((await pool.query(`SELECT count(*)::int AS n FROM sarsen.requests`)).rows[0].n);
    out(`seeded ${held.toLocaleString('en')} requests in ${fmt((performance.now() - seed0) / 1000, 0)} s; ${fmt((await storedBytes(pool)) / 2 ** 30, 2)} GB, ${fmt((await storedBytes(pool)) / held, 0)} bytes per request (tables, TOAST and indexes)`);
    out();
    const recordId = (await pool.query(`SELECT id FROM sarsen.requests WHERE NOT streaming ORDER BY id DESC OFFSET 1000 LIMIT 1`)).rows[0].id;

    progress('reads before retirement');
    const readsBefore = await reads(origin, t.basePath, key, recordId);

    progress('retiring a day by DROP, then another by DELETE (quiet)');
    const retirements = [await retireByDrop(pool, target), await retireByDelete(pool, target, first + 10 * DAY)];
    out(`Retiring one day of payloads (${PER_DAY.toLocaleString('en')} requests), no other traffic`);
    out(table(['path', 'records', 'seconds', 'WAL MB', 'dead tuples left'], retirements.map((r) => [r.how, r.records.toLocaleString('en'), fmt(r.ms / 1000, 3), fmt(r.wal / 2 ** 20, 2), r.dead.toLocaleString('en')])));
    out('(WAL is the server\'s, measured by pg_current_wal_lsn(): on a shared server it includes others\' writes.)');
    out();

    progress('traffic: none, during a DELETE, during a DROP');
    await traffic('warm-up', origin, t.basePath, key, null);
    const days = (await listPartitions(pool, PAYLOADS.tables)).length / PAYLOADS.tables.length;
    const runs = [
      fresh,
      await traffic(`no retirement (${days} payload partitions)`, origin, t.basePath, key, null),
      await traffic('DELETE of a day', origin, t.basePath, key, () => retireByDelete(pool!, target, first + 11 * DAY, false)),
      await traffic('DROP of a day', origin, t.basePath, key, () => retireByDrop(pool!, target, false)),
      await traffic('no retirement, again', origin, t.basePath, key, null),
    ];
    out(`Traffic during retirement: closed loop, c=${C}, ${SECONDS} s (ms)`);
    out(table(['run', 'req/s', 'vs none', 'p50', 'p99', 'p99 vs none', 'max', 'retirement s', 'slowest while retiring'], runs.map((r) => [
      r.name, fmt(r.rate, 0), fmt(r.rate / runs[1]!.rate, 3), fmt(r.p50, 2), fmt(r.p99, 2), fmt(r.p99 / runs[1]!.p99, 3), fmt(r.max, 1), r.retireMs ? fmt(r.retireMs / 1000, 2) : '-', fmt(r.duringMax, 1),
    ])));
    out();

    progress('reads after retirement');
    const readsAfter = await reads(origin, t.basePath, key, recordId);
    out('Reads over HTTP, one keep-alive connection, 20 warm-up + samples (ms)');
    out(table(['read', 'p50 before', 'p99 before', 'p50 after', 'p99 after'], readsBefore.map((r, i) => [r.name, fmt(r.p50, 2), fmt(r.p99, 2), fmt(readsAfter[i]!.p50, 2), fmt(readsAfter[i]!.p99, 2)])));
    out();

    progress('retention cycles');
    const sizes: string[][] = [];
    // Per request whose payloads are held (the retired keep their metadata rows for the listing horizon).
    const perRequest = async () => (await storedBytes(pool!)) / Number((await pool!.query(`SELECT count(*)::int AS n FROM sarsen.requests WHERE id >= $1 AND NOT expired`, [await retiredBelow(pool!)])).rows[0].n);
    sizes.push(['start', fmt((await storedBytes(pool)) / 2 ** 20, 0), fmt(await perRequest(), 0)]);
    for (let c = 1; c <= CYCLES; c++) {
      await seedRecords(pool, target, PER_DAY, Date.now() - DAY + c * 60_000, 60_000);
      await retireByDrop(pool, target);
      sizes.push([`cycle ${c}`, fmt((await storedBytes(pool)) / 2 ** 20, 0), fmt(await perRequest(), 0)]);
    }
    out('Size through retention cycles (a day written, the oldest day dropped)');
    out(table(['when', 'MB', 'bytes per held request'], sizes));
    out();

    if (EXPORT_RECORDS > 0) {
      const { rows } = await pool.query(`SELECT id FROM sarsen.requests WHERE namespace_id = $1 ORDER BY id DESC OFFSET $2 LIMIT 1`, [t.namespaceId, EXPORT_RECORDS - 1]);
      const since = rows[0] ? idTime(rows[0].id) - 1 : 0;
      progress(`export of ${EXPORT_RECORDS.toLocaleString('en')} records`);
      const e = await exportRun(sarsen.url, { tenancy: t.tenancy, namespace: t.namespace, key }, since);
      out(`Export with payloads (sarsen export, to ${args['export-out']}): ${e.records.toLocaleString('en')} records in ${fmt(e.ms / 1000, 1)} s = ${fmt((e.records * 1000) / e.ms, 0)} records/s, peak RSS ${fmt(e.rssMb, 0)} MB`);
    }
  } finally {
    await pool?.end().catch(() => undefined);
    await sarsen?.stop(10_000).catch((err) => progress(`stopping Sarsen failed: ${err}`));
    await provider.kill('SIGTERM').catch(() => undefined);
    await shutdownDatabases();
  }
}

await main();
