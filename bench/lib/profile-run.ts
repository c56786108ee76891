// Where the time goes through Sarsen: a second Sarsen child that reaches its database through
// the counting proxy and runs with --cpu-prof. Reports round trips and transactions per
// request (the proxy's count, cross-checked with pg_stat_database.xact_commit), the request
// lifecycle stage by stage, idle background traffic, and the child's CPU profile.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import { createPool, type ConnectionConfig } from '../../src/db/pool.ts';
import { dbServer } from '../../test/support/db.ts';
import { startBenchSarsen } from './sarsen-child.ts';
import { startPgProxy, type RoundTrip } from './pg-proxy.ts';
import { provisionChat } from './provision.ts';
import { runLoad, describeUnexpected, type LoadRequest } from './load.ts';
import { countRoundTrips, requestStages } from './roundtrips.ts';
import { startWaitSampler } from './wait-sampler.ts';
import { tableStats, tableStatsReport } from './table-stats.ts';
import { summariseProfile, type Entry } from './cpuprofile.ts';
import { fmt, table, summarise } from './stats.ts';
import { cpuSnapshot, cpuShares, postmasterPid, type CpuShares, type CpuSnapshot } from './cpu.ts';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
// Backends flush their statistics at most once a second and, when idle, within 10 s.
const STATS_FLUSH_MS = 11_000;

export type ProfileOptions = {
  providerUrl: string;
  concurrency: number;
  warmupMs: number;
  durationMs: number;
  body(n: number): string;
  signal: AbortSignal;
  /** Keep the .cpuprofile file (its path is printed) instead of removing it. */
  keepProfile: boolean;
  out(line?: string): void;
};

async function xactCommit(pool: pg.Pool, db: string): Promise<number> {
  const { rows } = await pool.query<{ n: string }>('SELECT xact_commit::text AS n FROM pg_stat_database WHERE datname = $1', [db]);
  return Number(rows[0]?.n ?? NaN);
}

function entries(title: string, list: Entry[], out: (l?: string) => void): void {
  out(title);
  out(table(['ms', 'share', 'where'], list.map((e) => [fmt(e.ms, 0), `${fmt(e.share * 100, 1)}%`, e.name])));
  out();
}

export async function profileRun(o: ProfileOptions): Promise<void> {
  const { out } = o;
  const profDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-cpuprof-'));
  let proxy: Awaited<ReturnType<typeof startPgProxy>> | null = null;
  let sarsen: Awaited<ReturnType<typeof startBenchSarsen>> | null = null;
  let pool: pg.Pool | null = null;
  let window: { fromUs: number; toUs: number } | undefined;
  try {
    const { admin } = await dbServer();
    proxy = await startPgProxy({ host: admin.host, port: admin.port });
    const nodeOptions = [process.env.NODE_OPTIONS ?? '', '--cpu-prof', `--cpu-prof-dir=${profDir}`].join(' ').trim();
    sarsen = await startBenchSarsen({ via: proxy, env: { NODE_OPTIONS: nodeOptions }, settings: { shutdown_grace_ms: 5_000 } });
    pool = createPool(sarsen.db.conn, { max: 2, name: 'sarsen-bench-profile' });
    const tenant = await provisionChat(sarsen.url, pool, o.providerUrl);

    const postmaster = await postmasterPid(pool).catch(() => null);
    const cpu = () => cpuSnapshot(sarsen!.child.child.pid!, postmaster);
    const shares = (c: CpuShares, what: string, count: number, ms: number) =>
      `CPU (% of one core) sarsen ${fmt(c.sarsen, 0)}, postgres ${fmt(c.postgres, 0)}, bench+proxy ${fmt(c.bench, 0)}` +
      (count > 0 ? `; per ${what}: sarsen ${fmt((c.sarsen * ms) / 100 / count, 2)} ms, postgres ${fmt((c.postgres * ms) / 100 / count, 2)} ms` : '');

    await databaseBaseline(sarsen.db.conn, o.concurrency, cpu, out);

    let recording: RoundTrip[] | null = null;
    proxy.onRoundTrip((rt) => recording?.push(rt));
    const origin = new URL(sarsen.url).origin;
    // Numbered across both loads (each counts from 1): a measured body that repeated a warm-up
    // one would attach to its stored answer instead of calling the provider.
    let sent = 0;
    const request = (): LoadRequest => ({
      path: `${tenant.basePath}/chat/completions`,
      headers: { 'content-type': 'application/json', 'x-sarsen-key': tenant.key },
      body: o.body(++sent),
    });

    // Warm the caches and connections, then measure what an idle Sarsen sends on its own.
    await runLoad({ origin, concurrency: o.concurrency, warmupMs: 0, durationMs: o.warmupMs, next: request, expect: 200, signal: o.signal });
    await sleep(1_000);
    const idleMs = 3_000;
    recording = [];
    const idleCpu0 = cpu();
    await sleep(idleMs);
    const idleCpu = cpuShares(idleCpu0, cpu());
    const idle = countRoundTrips(recording, 1);
    recording = null;
    out(`Idle background (no traffic, ${idleMs / 1000} s): ${fmt((idle.roundTrips * 1000) / idleMs, 1)} round trips/s, ${fmt((idle.transactions * 1000) / idleMs, 1)} transactions/s; ${shares(idleCpu, '', 0, idleMs)}`);
    for (const s of idle.byStatement.slice(0, 5)) out(`  ${fmt(s.count / (idleMs / 1000), 1)}/s  ${s.label}`);
    out();

    await sleep(STATS_FLUSH_MS);
    const x0 = await xactCommit(pool, sarsen.db.name);
    const t0 = await tableStats(pool);
    recording = [];
    const fromUs = Number(process.hrtime.bigint() / 1000n);
    const sampler = await startWaitSampler(sarsen.db.conn, sarsen.db.name);
    const loadCpu0 = cpu();
    const loaded = await runLoad({ origin, concurrency: o.concurrency, warmupMs: 0, durationMs: o.durationMs, next: request, expect: 200, signal: o.signal });
    const loadCpu = cpuShares(loadCpu0, cpu());
    const waits = await sampler.stop();
    const toUs = Number(process.hrtime.bigint() / 1000n);
    await sleep(500); // graphile-worker completes the job just after the answer went out
    const rts = recording;
    recording = null;
    await sleep(STATS_FLUSH_MS);
    const x1 = await xactCommit(pool, sarsen.db.name);
    const t1 = await tableStats(pool);
    // The two xact_commit reads and the sleeps' background traffic are in the difference too.
    const backgroundTx = ((idle.transactions * 1000) / idleMs) * ((o.durationMs + 500 + STATS_FLUSH_MS) / 1000);
    const requests = loaded.sent - [...loaded.unexpected.values()].reduce((a, b) => a + b, 0);
    const lat = summarise(loaded.latencies);

    out(`Profiled load: c=${o.concurrency}, ${o.durationMs / 1000} s through the proxy, ${requests} requests answered 200 (${fmt(loaded.rate, 0)}/s, p50 ${fmt(lat.p50, 2)} ms, p99 ${fmt(lat.p99, 2)} ms; the proxy itself adds latency); unexpected: ${describeUnexpected(loaded.unexpected)}`);
    const rep = countRoundTrips(rts, requests);
    out(`  ${shares(loadCpu, 'request', requests, o.durationMs)}`);
    window = { fromUs, toUs };
    out(`Round trips per request: ${fmt(rep.roundTrips / requests, 2)}    transactions per request (proxy): ${fmt(rep.transactions / requests, 2)}    transactions per request (pg_stat_database.xact_commit, idle background subtracted): ${fmt((x1 - x0 - backgroundTx) / requests, 2)} (raw ${fmt((x1 - x0) / requests, 2)})`);
    out();
    out(table(['per req', 'mean ms', 'statement'], rep.byStatement.slice(0, 25).map((s) => [fmt(s.perRequest, 3), fmt(s.meanMs, 2), s.label])));
    out();
    out(`Database backends of this database not idle, sampled ${waits.samples} times (average number of backends in each state):`);
    out(table(['backends', 'state, wait event'], waits.byState.map(([k, v]) => [fmt(v / waits.samples, 2), k])));
    if (waits.lockWaitsBy.length) {
      out('Lock waits by statement (samples):');
      out(table(['samples', 'wait in statement'], waits.lockWaitsBy.map(([k, v]) => [String(v), k])));
    }
    out();
    out('Table activity per request (pg_stat_user_tables; dead/live tuples at the end):');
    out(tableStatsReport(t0, t1, requests));
    out();
    const { stages, followed } = requestStages(rts);
    out(`Request lifecycle, proxy clock (${followed} requests followed by id):`);
    out(table(['p50 ms', 'p90 ms', 'p99 ms', 'stage'], Object.entries(stages).map(([k, s]) => [fmt(s.p50, 2), fmt(s.p90, 2), fmt(s.p99, 2), k])));
    out();
  } finally {
    await pool?.end().catch(() => undefined);
    await sarsen?.stop().catch(() => undefined); // SIGTERM: the child exits normally and writes its profile
    await proxy?.close().catch(() => undefined);
  }
  try {
    const files = fs.readdirSync(profDir).filter((f) => f.endsWith('.cpuprofile'));
    if (files.length === 0) {
      out('No CPU profile was written (the child did not exit normally).');
      return;
    }
    const file = path.join(profDir, files[0]!);
    let s = summariseProfile(file, ROOT, 20, window);
    let scope = 'during the profiled load';
    if (s.samples === 0) {
      s = summariseProfile(file, ROOT, 20);
      scope = 'over its whole life (no samples matched the load window)';
    }
    out(`Sarsen child CPU profile ${scope}: ${fmt(s.totalMs / 1000, 2)} s sampled, idle included${o.keepProfile ? `; kept at ${file}` : ''}`);
    out();
    entries('Self time by module:', s.selfByModule, out);
    entries('Self time by function:', s.selfByFunction, out);
    entries('Inclusive time by function:', s.inclusiveByFunction, out);
  } finally {
    if (!o.keepProfile) fs.rmSync(profDir, { recursive: true, force: true });
  }
}

/**
 * What this PostgreSQL does on its own: closed-loop round trips straight from a pool, no
 * Sarsen. Sarsen's round trips per request divide into this to give its ceiling.
 */
async function databaseBaseline(conn: ConnectionConfig, concurrency: number, cpu: () => CpuSnapshot, out: (l?: string) => void): Promise<void> {
  const pool = createPool(conn, { max: concurrency, name: 'sarsen-bench-baseline' });
  const ms = 2_000;
  try {
    const cases: [string, (c: pg.PoolClient, i: number) => Promise<unknown>][] = [
      ['SELECT 1 (simple protocol)', (c) => c.query('SELECT 1')],
      ['SELECT $1::text (extended protocol, as node-pg sends parameterised queries)', (c, i) => c.query('SELECT $1::text', [String(i)])],
    ];
    for (const [name, fn] of cases) {
      const clients = await Promise.all(Array.from({ length: concurrency }, () => pool.connect()));
      let n = 0;
      const end = performance.now() + ms;
      const c0 = cpu();
      await Promise.all(clients.map(async (c) => {
        while (performance.now() < end) await fn(c, ++n);
      }));
      const c = cpuShares(c0, cpu());
      for (const client of clients) client.release();
      out(`Database baseline, ${name}, c=${concurrency}, no Sarsen: ${fmt((n * 1000) / ms, 0)} round trips/s; postgres ${fmt(c.postgres, 0)}% of one core, ${fmt(((c.postgres / 100) * ms * 1000) / n, 1)} µs of postgres CPU per round trip`);
    }
  } finally {
    await pool.end();
  }
  out();
}
