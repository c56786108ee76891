// The accounts benchmark (docs/performance.md "Targets", last row; issue 7): a namespace with 1,000,000
// requests over 60 days, then the latency over real HTTP of the first and the 100th listing
// page, GET /usage without and with `since`, and GET /storage, against the < 20 ms target.
// One keep-alive connection, requests one at a time, a warm-up before each measure.
//
// Run: npm run bench:accounts [-- --rows 1000000 --days 60 --samples 200 --warmup 50 --verbose]
// `--verbose` prints EXPLAIN (ANALYZE, BUFFERS) of the statements behind the routes.
import os from 'node:os';
import { Pool as HttpPool } from 'undici';
import pg from 'pg';
import { startFakeProvider, type FakeProvider } from '../test/support/fake-provider.ts';
import { shutdownDatabases } from '../test/support/db.ts';
import { benchDatabase } from './lib/database.ts';
import { listRequests, namespaceTotals, usageByKey } from '../src/db/accounting.ts';
import { startBenchSarsen, type BenchSarsen } from './lib/sarsen-child.ts';
import { assertLoopback } from './lib/load.ts';
import { percentile, fmt, table } from './lib/stats.ts';
import { provisionAccounts, seedNamespace, settle, type AccountsTenant, type SeedStep } from './lib/accounts-seed.ts';
import { captureSql, explain, keyLines, type Plan } from './lib/accounts-explain.ts';
import { benchArgs } from './lib/args.ts';

const TARGET_MS = 20; // docs/performance.md "Targets": listing page / GET /usage < 20 ms
const HARD_LIMIT_MS = 10 * 60_000;
const FEE_MICROS = 100;
const PAGE = 50;
const DAY_MS = 86_400_000;
const BIG_TABLES = ['sarsen.requests', 'sarsen.ledger', 'sarsen.key_usage_hourly', 'requests', 'ledger', 'key_usage_hourly'];

const args = benchArgs({
  rows: { type: 'string', default: '1000000' },
  'neighbour-rows': { type: 'string', default: '250000' },
  days: { type: 'string', default: '60' },
  samples: { type: 'string', default: '200' },
  warmup: { type: 'string', default: '50' },
  keys: { type: 'string', default: '3' },
  verbose: { type: 'boolean', default: false },
  'allow-non-durable': { type: 'boolean', default: false },
});
const ROWS = Number(args.rows);
const NEIGHBOUR_ROWS = Number(args['neighbour-rows']);
const DAYS = Number(args.days);
const SAMPLES = Number(args.samples);
const WARMUP = Number(args.warmup);
const KEYS = Number(args.keys);
if (![ROWS, DAYS, SAMPLES, KEYS].every((n) => Number.isInteger(n) && n > 0) || !(WARMUP >= 0) || !(NEIGHBOUR_ROWS >= 0) || ROWS < 100 * PAGE + 1) {
  throw new Error(`usage: --rows N (> ${100 * PAGE}) --neighbour-rows N --days N --samples N --warmup N --keys N [--verbose]`);
}

const out = (line = '') => process.stdout.write(line + '\n');
const progress = (line: string) => process.stderr.write(`[bench] ${line}\n`);

type Get = { status: number; body: any };
type Measure = { name: string; path: string; samples: Float64Array };

function httpClient(origin: string, key: string) {
  assertLoopback(origin);
  const pool = new HttpPool(origin, { connections: 1, pipelining: 1, keepAliveTimeout: 60_000, headersTimeout: 30_000, bodyTimeout: 30_000 });
  const get = async (path: string): Promise<Get & { ms: number }> => {
    const t0 = performance.now();
    const res = await pool.request({ method: 'GET', path, headers: { 'x-sarsen-key': key } });
    const text = await res.body.text();
    const ms = performance.now() - t0;
    return { status: res.statusCode, body: JSON.parse(text), ms };
  };
  return { get, close: () => pool.close() };
}

type Client = ReturnType<typeof httpClient>;

async function measure(client: Client, name: string, path: string, check: (b: any) => void, signal: AbortSignal): Promise<Measure> {
  progress(`measure: ${name}`);
  const samples: number[] = [];
  for (let i = 0; i < WARMUP + SAMPLES && !signal.aborted; i++) {
    const r = await client.get(path);
    if (r.status !== 200) throw new Error(`${name}: GET ${path} answered ${r.status} ${JSON.stringify(r.body)}`);
    if (i === 0) check(r.body);
    if (i >= WARMUP) samples.push(r.ms);
  }
  return { name, path, samples: Float64Array.from(samples).sort() };
}

/** Follows the cursors from the first page; answers the cursor of page `n` and the mean ms per hop. */
async function walkTo(client: Client, base: string, n: number): Promise<{ cursor: string; hopMs: number }> {
  let cursor: string | null = null;
  let total = 0;
  for (let page = 1; page < n; page++) {
    const r = await client.get(`${base}/requests?limit=${PAGE}${cursor ? `&after=${encodeURIComponent(cursor)}` : ''}`);
    if (r.status !== 200 || r.body.data.length !== PAGE || !r.body.next_after) throw new Error(`page ${page}: ${r.status} ${JSON.stringify(r.body).slice(0, 300)}`);
    cursor = r.body.next_after as string;
    total += r.ms;
  }
  return { cursor: cursor!, hopMs: total / (n - 1) };
}

type Seed = { steps: SeedStep[]; tableBytes: Record<string, number> };
type Figures = { seed: Seed; measures: Measure[]; hopMs: number; plans: { name: string; plan: Plan }[] };

function report(f: Figures): void {
  out(`Seed: ${ROWS.toLocaleString('en')} requests in namespace main (${KEYS} keys) and ${NEIGHBOUR_ROWS.toLocaleString('en')} in a neighbour namespace (1 key), each over the last ${DAYS} days`);
  out(table(['step', 'rows', 'seconds'], f.seed.steps.map((s) => [s.what, s.rows ? s.rows.toLocaleString('en') : '-', fmt(s.ms / 1000, 1)])));
  out(`table sizes (with indexes): ${Object.entries(f.seed.tableBytes).map(([n, b]) => `${n} ${fmt(b / 2 ** 20, 0)} MB`).join(', ')}`);
  out();
  out(`Latency over HTTP, one keep-alive connection, ${WARMUP} warm-up + ${SAMPLES} samples each (ms)`);
  out(table(
    ['measure', 'p50', 'p95', 'p99', 'max', 'target', 'verdict (p99)'],
    f.measures.map((m) => {
      const p99 = percentile(m.samples, 99);
      return [m.name, fmt(percentile(m.samples, 50), 2), fmt(percentile(m.samples, 95), 2), fmt(p99, 2), fmt(m.samples[m.samples.length - 1] ?? NaN, 2),
        `< ${TARGET_MS} ms`, p99 < TARGET_MS ? 'met' : `MISSED (${fmt(p99 - TARGET_MS, 2)} ms over)`];
    }),
  ));
  out(`walking pages 1 to 99 by cursor: ${fmt(f.hopMs, 2)} ms per page on average (cold pages included)`);
  out();
  out('Statements behind the routes (src/db/accounting.ts), EXPLAIN ANALYZE in the database');
  out(table(
    ['statement', 'planning ms', 'execution ms', 'rows read', 'seq scans of big tables', 'index-backed'],
    f.plans.map(({ name, plan }) => {
      const big = plan.seqScans.filter((t) => BIG_TABLES.includes(t));
      return [name, fmt(plan.planningMs, 3), fmt(plan.executionMs, 3), plan.rowsRead.toLocaleString('en'), big.join(', ') || 'none', big.length ? 'NO' : 'yes'];
    }),
  ));
  out();
  for (const { name, plan } of f.plans) {
    out(`-- ${name}`);
    for (const l of args.verbose ? plan.lines : keyLines(plan)) out(`   ${l}`);
  }
  if (!args.verbose) out('(key plan lines only; --verbose prints the whole EXPLAIN (ANALYZE, BUFFERS) output)');
  out();
}

async function plans(pool: pg.Pool, t: AccountsTenant, page100Before: string, sinceWeek: number): Promise<Figures['plans']> {
  const cases: [string, (p: pg.Pool) => Promise<unknown>][] = [
    ['listing page 1', (p) => listRequests(p, t.namespaceId, null, PAGE + 1)],
    ['listing page 100', (p) => listRequests(p, t.namespaceId, page100Before, PAGE + 1)],
    ['usage totals (and storage)', (p) => namespaceTotals(p, t.namespaceId)],
    ['usage per key, default 30 days', (p) => usageByKey(p, t.namespaceId, new Date(Date.now() - 30 * DAY_MS))],
    ['usage per key, since 7 days', (p) => usageByKey(p, t.namespaceId, new Date(sinceWeek))],
    [`usage per key, since ${DAYS + 1} days`, (p) => usageByKey(p, t.namespaceId, new Date(Date.now() - (DAYS + 1) * DAY_MS))],
  ];
  const result: Figures['plans'] = [];
  for (const [name, fn] of cases) {
    const [q] = await captureSql(fn);
    if (!q) throw new Error(`${name}: no statement captured`);
    await explain(pool, q); // the first run warms the caches the HTTP samples had warmed already
    result.push({ name, plan: await explain(pool, q) });
  }
  return result;
}

/** GET /usage's per-key figures from `since` recounted from every raw event (a full scan: a check, not a measure). */
async function recountUsage(pool: pg.Pool, namespaceId: string, since: number): Promise<unknown[]> {
  const { rows } = await pool.query(
    `SELECT k.api_key_id,
            (SELECT count(*) FROM sarsen.ledger l WHERE l.namespace_id = $1 AND l.api_key_id = k.api_key_id AND l.created_at >= $2)::bigint AS ledger_events,
            count(*) FILTER (WHERE q.provider_reached)::bigint AS provider_calls,
            sum(q.prompt_tokens) FILTER (WHERE q.status = 'succeeded')::bigint AS prompt_tokens,
            sum(q.completion_tokens) FILTER (WHERE q.status = 'succeeded')::bigint AS completion_tokens,
            sum(q.total_tokens) FILTER (WHERE q.status = 'succeeded')::bigint AS total_tokens,
            count(*) FILTER (WHERE q.cached_from IS NOT NULL)::bigint AS cache_hits
       FROM (SELECT DISTINCT api_key_id FROM sarsen.ledger WHERE namespace_id = $1 AND created_at >= $2) k
       JOIN sarsen.requests q ON q.api_key_id = k.api_key_id AND q.namespace_id = $1 AND q.finished_at >= $2
      GROUP BY k.api_key_id ORDER BY k.api_key_id`,
    [namespaceId, new Date(since)],
  );
  return rows;
}

async function run(sarsen: BenchSarsen, pool: pg.Pool, provider: FakeProvider, signal: AbortSignal): Promise<Figures> {
  const { main: t, neighbour } = await provisionAccounts(sarsen.url, pool, provider.url, KEYS);
  const steps: SeedStep[] = [];
  await seedNamespace(pool, t, ROWS, DAYS, FEE_MICROS, steps, progress);
  if (NEIGHBOUR_ROWS > 0) await seedNamespace(pool, neighbour, NEIGHBOUR_ROWS, DAYS, FEE_MICROS, steps, progress);
  const seed = { steps, tableBytes: await settle(pool, steps, progress) };
  const client = httpClient(new URL(sarsen.url).origin, t.keys[0]!.key);
  try {
    const base = t.basePath;
    progress('walking to page 100');
    const { cursor, hopMs } = await walkTo(client, base, 100);
    const page100 = await client.get(`${base}/requests?limit=${PAGE}&after=${encodeURIComponent(cursor)}`);
    // The 100th page starts at the 4,951st newest row, whatever the cursor looks like.
    const { rows: expect } = await pool.query<{ id: string }>(
      `SELECT id FROM sarsen.requests WHERE namespace_id = $1 ORDER BY id DESC OFFSET $2 LIMIT 1`, [t.namespaceId, 99 * PAGE]);
    if (page100.body.data[0]?.request_id !== expect[0]?.id) throw new Error(`page 100 starts at ${page100.body.data[0]?.request_id}, expected ${expect[0]?.id}`);
    const lastOf99 = (await pool.query<{ id: string }>(
      `SELECT id FROM sarsen.requests WHERE namespace_id = $1 ORDER BY id DESC OFFSET $2 LIMIT 1`, [t.namespaceId, 99 * PAGE - 1])).rows[0]!.id;

    const sinceWeek = Date.now() - 7 * DAY_MS;
    const fullPage = (b: any) => {
      if (b.data.length !== PAGE || !b.next_after) throw new Error(`listing answered ${b.data.length} rows`);
    };
    const usageCheck = (b: any) => {
      if (b.accepted_submissions !== ROWS || b.provider_calls !== ROWS || b.api_keys.length !== KEYS) {
        throw new Error(`usage answered ${JSON.stringify(b).slice(0, 400)}`);
      }
    };
    // The window is exact: the answer equals a recount of the raw events from `since` on.
    const expectedWeek = await recountUsage(pool, t.namespaceId, sinceWeek);
    const weekCheck = (b: any) => {
      usageCheck(b);
      if (b.itemised_since !== sinceWeek || JSON.stringify(b.api_keys) !== JSON.stringify(expectedWeek)) {
        throw new Error(`usage since ${sinceWeek} answered ${JSON.stringify(b)}, a recount says ${JSON.stringify(expectedWeek)}`);
      }
    };
    const storageCheck = (b: any) => {
      if (!(b.stored_bytes > 0) || b.stored_bytes !== b.request_bytes + b.response_bytes + b.chunk_bytes) throw new Error(`storage answered ${JSON.stringify(b)}`);
    };
    const measures: Measure[] = [];
    const add = async (name: string, path: string, check: (b: any) => void) => measures.push(await measure(client, name, path, check, signal));
    await add(`listing page 1 (limit ${PAGE})`, `${base}/requests?limit=${PAGE}`, fullPage);
    await add(`listing page 100 (limit ${PAGE})`, `${base}/requests?limit=${PAGE}&after=${encodeURIComponent(cursor)}`, fullPage);
    await add('GET /usage (default: 30 days)', `${base}/usage`, usageCheck);
    await add('GET /usage?since=7 days ago', `${base}/usage?since=${sinceWeek}`, weekCheck);
    await add(`GET /usage?since=${DAYS + 1} days ago (all)`, `${base}/usage?since=${Date.now() - (DAYS + 1) * DAY_MS}`, usageCheck);
    await add('GET /storage', `${base}/storage`, storageCheck);
    if (signal.aborted) throw new Error('interrupted');
    progress('plans');
    return { seed, measures, hopMs, plans: await plans(pool, t, lastOf99, sinceWeek) };
  } finally {
    await client.close();
  }
}

async function main(): Promise<void> {
  const abort = new AbortController();
  const onSignal = () => {
    progress('interrupted: cleaning up');
    abort.abort();
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const watchdog = setTimeout(() => {
    progress(`hard limit of ${HARD_LIMIT_MS / 60_000} minutes reached`);
    abort.abort();
  }, HARD_LIMIT_MS);
  watchdog.unref();

  let provider: FakeProvider | null = null;
  let sarsen: BenchSarsen | null = null;
  let pool: pg.Pool | null = null;
  try {
    const db = await benchDatabase({ allowNonDurable: args['allow-non-durable'] });
    provider = await startFakeProvider();
    progress('starting Sarsen (child process) against a fresh database');
    sarsen = await startBenchSarsen({ settings: { shutdown_grace_ms: 5_000, request_fee_micros: FEE_MICROS } });
    // A plain pool, without the deadline every Sarsen pool keeps (10 s): seeding a million rows
    // is one statement that takes longer on a 2-core machine.
    const { host, port, user, database, password } = sarsen.db.conn;
    pool = new pg.Pool({ host, port, user, database, password, max: 2, application_name: 'sarsen-bench' });

    out(`Sarsen accounts benchmark — ${new Date().toISOString()}`);
    out(`machine: ${os.cpus().length} × ${os.cpus()[0]?.model ?? '?'}, load average ${os.loadavg().map((l) => fmt(l, 2)).join(' ')}; node ${process.version}`);
    out(`database: ${db.describe}; Sarsen child process ${sarsen.url} (role both)`);
    out();
    const figures = await run(sarsen, pool, provider, abort.signal);
    report(figures);
    const missed = figures.measures.filter((m) => !(percentile(m.samples, 99) < TARGET_MS));
    out(missed.length ? `Target missed by: ${missed.map((m) => m.name).join('; ')}` : `Every measure is under ${TARGET_MS} ms at p99.`);
    if (missed.some((m) => m.path.includes('/usage'))) {
      out('GET /usage itemises keys from sarsen.key_usage_hourly: it reads a row per window hour and key (and per shard older releases wrote) (see "rows read"), so its cost grows with the window.');
    }
  } finally {
    clearTimeout(watchdog);
    await pool?.end().catch(() => undefined);
    await sarsen?.stop(10_000).catch((err) => progress(`stopping Sarsen failed: ${err}`));
    await provider?.close().catch(() => undefined);
    await shutdownDatabases();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

await main();
