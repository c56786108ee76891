// Work per request and per frame, counted (issue 62's targets 3 and 4): Sarsen alone, on the
// benchmark's own durable PostgreSQL (lib/owned-postgres.ts), nothing pinned. Counts hold on a
// busy machine where timings do not: rows inserted, updated and deleted per table
// (pg_stat_user_tables, summed over partitions), WAL bytes (the server's, which nothing else
// writes), commits, and the statements with their rows and WAL a call (pg_stat_statements).
//   requests  wrk, non-streaming, every body distinct, at --concurrency for --seconds
//   streams   --streams streams of --frames frames --frame-ms apart
// Run: npm run bench:work [-- --seconds 5 --concurrency 16 --streams 50 --frames 100 --parts requests,streams]
import path from 'node:path';
import crypto from 'node:crypto';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import { shutdownDatabases } from '../test/support/db.ts';
import { spawnNode, type SarsenChild } from '../test/support/child.ts';
import { createPool } from '../src/db/pool.ts';
import { configureLogging } from '../src/log.ts';
import { benchDatabase } from './lib/database.ts';
import { startBenchSarsen, type BenchSarsen } from './lib/sarsen-child.ts';
import { provisionChat } from './lib/provision.ts';
import { runWrk } from './lib/wrk.ts';
import { runLongStreams } from './lib/long-streams.ts';
import { startOwnedPostgres, type OwnedPostgres } from './lib/owned-postgres.ts';
import { settledDbCost, costBetween, statementCounts, busiestStatements, type DbCost, type StatementCounts } from './lib/db-cost.ts';
import { allowedCpus } from './lib/pin.ts';
import { fmt, table } from './lib/stats.ts';
import { benchArgs } from './lib/args.ts';

const args = benchArgs({
  seconds: { type: 'string', default: '5' },
  concurrency: { type: 'string', default: '16' },
  streams: { type: 'string', default: '200' },
  frames: { type: 'string', default: '100' },
  'frame-ms': { type: 'string', default: '30' },
  parts: { type: 'string', default: 'requests,streams' },
});
const PARTS = new Set(args.parts.split(','));
const out = (line = '') => process.stdout.write(line + '\n');
const progress = (line: string) => process.stderr.write(`[bench:work] ${line}\n`);
const HERE = path.dirname(fileURLToPath(import.meta.url));
const TAG = crypto.randomBytes(4).toString('hex');
const chatBody = `{"model":"gpt-bench","messages":[{"role":"user","content":"work ${TAG} {n}"}]}`;

type Tables = Map<string, { ins: number; upd: number; del: number }>;
type Mark = { cost: DbCost; statements: StatementCounts; tables: Tables; lsn: string };

/**
 * WAL between two positions by relation (pg_walinspect): each record's whole length (its page
 * images too) counted against the relation of its first block, partitions and their indexes
 * under their parent's name; records of no relation (commits) as `(none)`.
 */
async function walByRelation(stats: pg.Pool, own: pg.Pool, from: string, to: string): Promise<[string, number][]> {
  const { rows } = await stats.query<{ node: string; bytes: string | null; fpi: string }>(
    `SELECT relfilenode::text AS node, sum(record_length) FILTER (WHERE block_id = 0) AS bytes, sum(block_fpi_length) AS fpi FROM pg_get_wal_block_info($1, $2) GROUP BY 1`,
    [from, to],
  );
  const total = await stats.query<{ bytes: string }>(`SELECT pg_wal_lsn_diff($2, $1) AS bytes`, [from, to]);
  const names = new Map((await own.query<{ node: string; name: string }>(
    `SELECT c.relfilenode::text AS node, coalesce(p.relname, c.relname) AS name FROM pg_class c
       LEFT JOIN pg_inherits i ON i.inhrelid = c.oid LEFT JOIN pg_class p ON p.oid = i.inhparent WHERE c.relfilenode <> 0`,
  )).rows.map((r) => [r.node, r.name]));
  const by = new Map<string, number>();
  let counted = 0;
  for (const r of rows) {
    const name = names.get(r.node) ?? `other (${r.node})`;
    by.set(name, (by.get(name) ?? 0) + Number(r.bytes ?? 0));
    by.set(' of which page images', (by.get(' of which page images') ?? 0) + Number(r.fpi));
    counted += Number(r.bytes ?? 0);
  }
  by.set('(no relation: commits, ...)', Number(total.rows[0]!.bytes) - counted);
  return [...by].sort((a, b) => b[1] - a[1]);
}

/** Rows written per table, partitions summed under their parent's name. */
async function tables(pool: pg.Pool): Promise<Tables> {
  const { rows } = await pool.query<{ name: string; ins: string; upd: string; del: string }>(
    `SELECT coalesce(p.relname, c.relname) AS name, sum(s.n_tup_ins) AS ins, sum(s.n_tup_upd) AS upd, sum(s.n_tup_del) AS del
       FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
       LEFT JOIN pg_inherits i ON i.inhrelid = c.oid LEFT JOIN pg_class p ON p.oid = i.inhparent
      GROUP BY 1`,
  );
  return new Map(rows.map((r) => [r.name, { ins: Number(r.ins), upd: Number(r.upd), del: Number(r.del) }]));
}

async function main(): Promise<void> {
  configureLogging({ level: 'warn' });
  let owned: OwnedPostgres | null = null;
  let stats: pg.Pool | null = null;
  let own: pg.Pool | null = null;
  let provider: SarsenChild | null = null;
  let sarsen: BenchSarsen | null = null;
  try {
    owned = await startOwnedPostgres(allowedCpus().join(','));
    const db = await benchDatabase({ allowNonDurable: false });
    out(`database: ${db.describe}`);
    stats = createPool({ ...owned.conn, database: 'postgres' }, { max: 1, name: 'work-stats' });
    await stats.query('CREATE EXTENSION IF NOT EXISTS pg_walinspect');
    provider = spawnNode(path.join(HERE, 'lib/provider-process.ts'), ['--frames', args.frames, '--pace', args['frame-ms'], '--record'], process.env, 'bench provider');
    const [, providerUrl] = await provider.waitFor(/listening (http:\S+)/, 30_000);
    sarsen = await startBenchSarsen({ settings: { shutdown_grace_ms: 5_000 }, processes: 'default' });
    own = createPool(sarsen.db.conn, { max: 1, name: 'work-tables' });
    const tenant = await provisionChat(sarsen.url, own, providerUrl!);
    const side = { name: 'sarsen', url: `${sarsen.url}${tenant.basePath}/chat/completions`, headers: { 'content-type': 'application/json', 'x-sarsen-key': tenant.key }, pid: sarsen.child.child.pid! };
    const database = sarsen.db.name;
    const mark = async (): Promise<Mark> => {
      // An idle backend reports its table counters within 10 s (PostgreSQL's idle flush), not at once.
      await new Promise((r) => setTimeout(r, 11_000));
      const cost = await settledDbCost(stats!, database);
      const lsn = (await stats!.query<{ lsn: string }>('SELECT pg_current_wal_lsn()::text AS lsn')).rows[0]!.lsn;
      return { cost, statements: await statementCounts(stats!, database), tables: await tables(own!), lsn };
    };
    const report = async (what: string, unit: string, a: Mark, b: Mark, n: number) => {
      const d = costBetween(a.cost, b.cost);
      out(`${what}: ${n} ${unit}s`);
      out(`  per ${unit}: rows written ${fmt(d.rows / n, 3)} (ins ${fmt(d.inserted / n, 3)}, upd ${fmt(d.updated / n, 3)}, del ${fmt(d.deleted / n, 3)}), commits ${fmt(d.commits / n, 3)}, statements ${fmt(d.statements / n, 3)}, WAL bytes ${fmt(d.walBytes / n, 0)}`);
      const rows: string[][] = [];
      for (const [name, after] of b.tables) {
        const before = a.tables.get(name) ?? { ins: 0, upd: 0, del: 0 };
        const [ins, upd, del] = [after.ins - before.ins, after.upd - before.upd, after.del - before.del];
        if (ins + upd + del > 0) rows.push([name, fmt(ins / n, 3), fmt(upd / n, 3), fmt(del / n, 3)]);
      }
      out(table(['table', 'ins', 'upd', 'del'], rows.sort((x, y) => x[0]!.localeCompare(y[0]!))).replace(/^/gm, '  '));
      const wal = await walByRelation(stats!, own!, a.lsn, b.lsn);
      out(table(['relation', `WAL bytes a ${unit}`], wal.filter(([, bytes]) => bytes / n >= 1).map(([name, bytes]) => [name, fmt(bytes / n, 0)])).replace(/^/gm, '  '));
      const busiest = busiestStatements(a.statements, b.statements, n, 14);
      out(table(['calls', 'rows', 'WAL', 'statement'], busiest.map((s) => [fmt(s.perUnit, 3), fmt(s.rowsPerCall, 1), fmt(s.walPerCall, 0), s.query.length > 110 ? `${s.query.slice(0, 110)}…` : s.query])).replace(/^/gm, '  '));
    };
    if (PARTS.has('requests')) {
      const load = { url: side.url, headers: side.headers, body: chatBody, connections: Number(args.concurrency), timeoutS: 10 };
      await runWrk({ ...load, durationS: 1 });
      const a = await mark();
      const r = await runWrk({ ...load, durationS: Number(args.seconds) });
      const b = await mark();
      await report(`non-streaming c=${args.concurrency}, ${args.seconds} s, ${r.non2xx} failed`, 'request', a, b, r.requests);
    }
    if (PARTS.has('streams')) {
      const a = await mark();
      const run = await runLongStreams(side, providerUrl!, { streams: Number(args.streams), frames: Number(args.frames), frameMs: Number(args['frame-ms']), arrivalMs: 1000 }, { postmaster: null });
      const b = await mark();
      await report(`${args.streams} streams of ${args.frames} frames, ${run.byteExact} byte-exact`, 'frame', a, b, run.frames);
    }
  } finally {
    progress('cleaning up');
    await own?.end().catch(() => undefined);
    await sarsen?.stop().catch(() => undefined);
    await provider?.kill('SIGTERM');
    await stats?.end().catch(() => undefined);
    await shutdownDatabases();
    await owned?.stop();
  }
}

await main();
