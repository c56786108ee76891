// Many processes on one primary (docs/scaling.md): 1, 2, 4 and 8 pairs of `--role api` and
// `--role executor` processes on one database, under the mixed load of the integration tests
// (synchronous and streaming calls, POST /requests, identical bodies sent to two processes at
// once, replays by id from another api process), spread over the api processes.
//
// Two passes per size, each on a fresh database and fresh processes:
//  1. throughput: the processes reach PostgreSQL directly; calls answered per second, and
//     transactions committed per call (pg_stat_database.xact_commit of the database: read-only
//     ones included, this run's own few reads too);
//  2. counting: the processes reach PostgreSQL through a counting proxy (pg_stat_statements is
//     not loadable on a server started without it in shared_preload_libraries, the machine's
//     included); statements (round trips) and transactions per call, by statement, and NOTIFYs:
//     sent (distinct notifier, channel and payload) and delivered (to every listening
//     connection), per call.
// Every answer is checked byte for byte as the tests check it; mismatches are reported.
//
// Run alone on the machine: npm run bench:many [-- --pairs 1,2,4,8 --seconds 10 --warmup 5
//   --count-seconds 5 --concurrency 64 --pace 5] (--pace: ms between a stream's frames)
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { benchDatabase } from './lib/database.ts';
import { createTestDatabase, dbServer, shutdownDatabases, testPool, type TestDatabase } from '../test/support/db.ts';
import { makeSecretsDir, sarsenEnv, spawnNode, type SarsenChild } from '../test/support/child.ts';
import { spawnBenchSarsen, SARSEN_RUNTIME_ENV, killWithGrace } from './lib/sarsen-child.ts';
import { provision } from '../test/support/tenant.ts';
import type { FakeProvider } from '../test/support/fake-provider.ts';
import type { TestServer } from '../test/support/server.ts';
import { startMixedLoad, tally, type LoadTenant } from '../test/support/mixed-load.ts';
import { startPgProxy, type RoundTrip, type Notification } from './lib/pg-proxy.ts';
import { countRoundTrips } from './lib/roundtrips.ts';
import { fmt, table } from './lib/stats.ts';
import { processCpuMs, serverCpuMs } from './lib/cpu.ts';
import { defaultConnections } from '../src/core/connection-budget.ts';
import { benchArgs } from './lib/args.ts';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const args = benchArgs({
  pairs: { type: 'string', default: '1,2,4,8' },
  seconds: { type: 'string', default: '10' },
  warmup: { type: 'string', default: '5' },
  'count-seconds': { type: 'string', default: '5' },
  concurrency: { type: 'string', default: '64' },
  pace: { type: 'string', default: '5' },
  'allow-non-durable': { type: 'boolean', default: false },
});
const sizes = args.pairs.split(',').map(Number);
const seconds = Number(args.seconds);
const warmupMs = Number(args.warmup) * 1000;
const countSeconds = Number(args['count-seconds']);
const concurrency = Number(args.concurrency);
const out = (line = '') => process.stdout.write(line + '\n');
const progress = (line: string) => process.stderr.write(`[bench] ${line}\n`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

type Deployment = { db: TestDatabase; apis: string[]; tenant: LoadTenant; pids: { api: number[]; executor: number[] }; stop(): Promise<void> };

/** n api and n executor processes on a fresh database, reaching it directly or through `via`. */
async function deploy(n: number, connections: { api: number; executor: number }, providerUrl: string, via?: { host: string; port: number }): Promise<Deployment> {
  const db = await createTestDatabase({ backends_public_only: false });
  const secrets = makeSecretsDir(db.conn);
  const conn = via ? { ...db.conn, ...via } : db.conn;
  const children: SarsenChild[] = [];
  const pids = { api: [] as number[], executor: [] as number[] };
  const start = async (role: 'api' | 'executor') => {
    const child = spawnBenchSarsen(
      ['--role', role, '--port', '0', '--host', '127.0.0.1', '--database-connections', String(connections[role])],
      sarsenEnv(conn, secrets.dir, SARSEN_RUNTIME_ENV),
    );
    children.push(child);
    pids[role].push(child.child.pid!);
    return (await child.waitFor(/"url":"(http:[^"]+)"/, 60_000))[1]!;
  };
  const stop = async () => {
    await Promise.all(children.map((c) => killWithGrace(c, 5_000)));
    secrets.remove();
    await db.drop();
  };
  try {
    const apis = await Promise.all(Array.from({ length: n }, () => start('api')));
    await Promise.all(Array.from({ length: n }, () => start('executor')));
    const pool = testPool(db.conn, 2);
    try {
      const t = await provision({ url: apis[0], pool, db } as unknown as TestServer, { url: providerUrl } as FakeProvider);
      return { db, apis, tenant: t, pids, stop };
    } finally {
      await pool.end();
    }
  } catch (err) {
    await stop();
    throw err;
  }
}

async function xactCommits(client: pg.Client, db: string): Promise<number> {
  const { rows } = await client.query<{ n: string }>(`SELECT xact_commit AS n FROM pg_stat_database WHERE datname = $1`, [db]);
  return Number(rows[0]!.n);
}

type Cpu = { api: number; executor: number; postgres: number; load: number };
type Throughput = { callsPerSecond: number; commitsPerCall: number; cpu: Cpu; idle: Cpu; tally: string; problems: string[] };

/** CPU time (ms) of Sarsen's processes by role, the PostgreSQL server's, and this process with the provider's. */
function cpuNow(sarsen: Deployment['pids'], postmaster: number | null, provider: number): Cpu {
  const u = process.cpuUsage();
  const sum = (pids: number[]) => pids.reduce((t, pid) => t + (processCpuMs(pid) || 0), 0);
  return { api: sum(sarsen.api), executor: sum(sarsen.executor), postgres: serverCpuMs(postmaster), load: (u.user + u.system) / 1000 + processCpuMs(provider) };
}

const cpuKeys = ['api', 'executor', 'postgres', 'load'] as const;
const cpuSince = (from: Cpu, to: Cpu, per: number): Cpu => Object.fromEntries(cpuKeys.map((k) => [k, ((to[k] - from[k]) * 1000) / per])) as Cpu;

async function throughputPass(n: number, connections: { api: number; executor: number }, providerUrl: string, stats: pg.Client, postmaster: number | null, providerPid: number): Promise<Throughput> {
  const d = await deploy(n, connections, providerUrl);
  try {
    // What the processes cost with nothing to do: their timers, polls and watches.
    await sleep(2000);
    const idle0 = cpuNow(d.pids, postmaster, providerPid);
    await sleep(5000);
    const idle = cpuSince(idle0, cpuNow(d.pids, postmaster, providerPid), 5);
    const load = startMixedLoad(d.apis, d.tenant, { concurrency });
    await sleep(warmupMs);
    // Statistics reach pg_stat_database when a backend's transaction ends (flushed at most once a second).
    const [calls0, commits0, cpu0] = [load.count(), await xactCommits(stats, d.db.name), cpuNow(d.pids, postmaster, providerPid)];
    const t0 = performance.now();
    await sleep(seconds * 1000);
    const [calls1, elapsed, cpu1] = [load.count(), (performance.now() - t0) / 1000, cpuNow(d.pids, postmaster, providerPid)];
    const summary = await load.stop();
    await sleep(1100);
    const commits1 = await xactCommits(stats, d.db.name);
    const calls = calls1 - calls0;
    const problems = [...summary.errors, ...summary.mismatches, ...summary.ops.filter((o) => o.status >= 300).map((o) => `${o.kind} ${o.status} ${o.detail ?? ''}`)];
    return {
      callsPerSecond: calls / elapsed,
      commitsPerCall: (commits1 - commits0) / calls,
      cpu: cpuSince(cpu0, cpu1, calls), // µs per call
      idle,
      tally: tally(summary.ops),
      problems,
    };
  } finally {
    await d.stop();
  }
}

type Counts = { calls: number; statements: number; transactions: number; sent: number; delivered: number; byStatement: string[]; byChannel: string };

async function countingPass(n: number, connections: { api: number; executor: number }, providerUrl: string, target: { host: string; port: number }): Promise<Counts> {
  const proxy = await startPgProxy(target);
  try {
    const d = await deploy(n, connections, providerUrl, proxy);
    try {
      let counting = false;
      const rts: RoundTrip[] = [];
      const notes: Notification[] = [];
      proxy.onRoundTrip((rt) => void (counting && rts.push(rt)));
      proxy.onNotification((note) => void (counting && notes.push(note)));
      const load = startMixedLoad(d.apis, d.tenant, { concurrency });
      await sleep(warmupMs);
      const calls0 = load.count();
      counting = true;
      await sleep(countSeconds * 1000);
      counting = false;
      const calls = load.count() - calls0;
      await load.stop();
      const report = countRoundTrips(rts, calls);
      const channel = (c: string) => (c.startsWith('sarsen_') ? c.replace(/_[0-9A-Z]{2,}$/, '_<process>') : c);
      const byChannel = new Map<string, number>();
      for (const note of notes) byChannel.set(channel(note.channel), (byChannel.get(channel(note.channel)) ?? 0) + 1);
      const sent = new Set(notes.map((note) => `${note.pid} ${note.channel} ${note.payload}`)).size;
      return {
        calls,
        statements: report.roundTrips,
        transactions: report.transactions,
        sent,
        delivered: notes.length,
        byStatement: report.byStatement.slice(0, 10).map((s) => `${fmt(s.perRequest, 3).padStart(7)}  ${s.label}`),
        byChannel: [...byChannel].map(([c, k]) => `${c} ${fmt(k / calls, 3)}`).join(', '),
      };
    } finally {
      await d.stop();
    }
  } finally {
    await proxy.close();
  }
}

async function main(): Promise<void> {
  const server = await benchDatabase({ allowNonDurable: args['allow-non-durable'] });
  out(`database: ${server.describe}`);
  // Every process gets its role's default budget when the server has the connections for the
  // largest size; otherwise the budgets shrink alike at every size.
  const maxConnections = Number(server.settings.max_connections);
  const perPair = Math.floor((maxConnections - 12) / Math.max(...sizes));
  const defaults = { api: defaultConnections('api'), executor: defaultConnections('executor') };
  const connections =
    perPair >= defaults.api + defaults.executor
      ? defaults
      : { api: Math.max(4, Math.min(defaults.api, Math.floor(perPair * 0.45))), executor: Math.max(6, Math.min(defaults.executor, perPair - Math.max(4, Math.floor(perPair * 0.45)))) };
  out(`per process: --database-connections ${connections.api} (api), ${connections.executor} (executor); ${concurrency} callers in all, spread over the api processes; streams of 7 frames ${args.pace} ms apart`);
  const provider = spawnNode(path.join(HERE, 'lib/load-provider.ts'), ['--pace', args.pace], process.env, 'bench provider');
  const [, providerUrl] = await provider.waitFor(/listening (http:\S+)/, 30_000);
  const admin = (await dbServer()).admin;
  const stats = new pg.Client(admin);
  await stats.connect();
  // The server's processes are counted when it runs on this machine (its postmaster is a parent here).
  const backend = (await stats.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
  const postmaster = Number(fs.readFileSync(`/proc/${backend}/stat`, 'utf8').split(') ')[1]?.split(' ')[1] ?? NaN) || null;
  const rows: string[][] = [];
  const details: string[] = [];
  let base: number | null = null;
  try {
    for (const n of sizes) {
      progress(`${n} pair(s): throughput`);
      const t = await throughputPass(n, connections, providerUrl!, stats, postmaster, provider.child.pid!);
      progress(`${n} pair(s): counting through a proxy`);
      const c = await countingPass(n, connections, providerUrl!, { host: admin.host, port: admin.port });
      base ??= t.callsPerSecond;
      rows.push([
        String(n),
        fmt(t.callsPerSecond, 0),
        fmt(t.callsPerSecond / base, 2),
        fmt(c.statements / c.calls, 2),
        fmt(c.transactions / c.calls, 2),
        fmt(t.commitsPerCall, 2),
        fmt(c.sent / c.calls, 3),
        fmt(c.delivered / c.calls, 3),
        fmt(t.cpu.api + t.cpu.executor, 0),
        `${fmt(t.cpu.api, 0)} / ${fmt(t.cpu.executor, 0)}`,
        fmt(t.cpu.postgres, 0),
        fmt(t.cpu.load, 0),
        String(t.problems.length),
      ]);
      details.push(`${n} pair(s): ${t.tally}`, `  idle, before the load (ms of CPU a second): api ${fmt(t.idle.api / 1000, 1)}, executor ${fmt(t.idle.executor / 1000, 1)}, postgres ${fmt(t.idle.postgres / 1000, 1)}`, `  notifications delivered per call by channel: ${c.byChannel}`, '  statements per call:', ...c.byStatement.map((s) => `    ${s}`));
      if (t.problems.length) details.push('  problems:', ...t.problems.slice(0, 10).map((p) => `    ${p}`));
    }
  } finally {
    await stats.end();
    await provider.kill('SIGTERM');
    await shutdownDatabases();
  }
  out();
  out(table(['pairs', 'calls/s', 'vs 1', 'stmts/call', 'tx/call (proxy)', 'commits/call (pg_stat)', 'NOTIFY sent/call', 'delivered/call', 'CPU µs/call: sarsen', 'api / executor', 'postgres', 'load+provider', 'problems'], rows));
  out();
  for (const d of details) out(d);
  out();
  const last = rows.at(-1);
  if (last && sizes.length > 1) out(`target: ${Math.max(...sizes)} pairs keep >= 0.7x one pair's throughput: ${Number(last[2]) >= 0.7 ? 'met' : `MISSED (${last[2]}x)`}`);
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(`${(err as Error).stack ?? err}\n`);
    process.exit(1);
  },
);
