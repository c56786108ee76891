// Non-streaming throughput and added latency (docs/performance.md "Targets"), measured as ratios against
// a direct call in the same run: closed-loop load at each concurrency, first straight at the
// fake provider, then through a real Sarsen child process (every body distinct, so every
// request is a durable execution), then fire-and-forget `POST /requests` acceptance.
//
// Run: npm run bench:throughput [-- --seconds 5 --warmup 1 --concurrency 1,16,64 --accept-concurrency 64]
// `--profile` then starts a second Sarsen child that reaches PostgreSQL through a counting
// proxy and runs with --cpu-prof, and reports where the time goes (`--profile-concurrency 16`;
// `--keep-profile` keeps the .cpuprofile file for a viewer).
import os from 'node:os';
import crypto from 'node:crypto';
import type pg from 'pg';
import { startFakeProvider, type FakeProvider } from '../test/support/fake-provider.ts';
import { shutdownDatabases } from '../test/support/db.ts';
import { benchDatabase } from './lib/database.ts';
import { describeCommitLatency, measureCommitLatency } from './lib/commit-latency.ts';
import { createPool } from '../src/db/pool.ts';
import { startBenchSarsen, type BenchSarsen } from './lib/sarsen-child.ts';
import { provisionChat, type BenchTenant } from './lib/provision.ts';
import { runLoad, describeUnexpected, type LoadRequest, type LoadResult } from './lib/load.ts';
import { summarise, fmt, table, verdict, type Summary } from './lib/stats.ts';
import { cpuSnapshot, cpuShares, postmasterPid, type CpuShares } from './lib/cpu.ts';
import { profileRun } from './lib/profile-run.ts';
import { benchArgs } from './lib/args.ts';

// docs/performance.md's absolute targets; the throughput targets are ratios against a stateless
// gateway, measured side by side by bench/compare.ts.
const TARGETS = { addedP50C1: 2, addedP50C16: 10, addedP99C16: 40 };
const HARD_LIMIT_MS = 15 * 60_000; // the whole run, whatever happens
const DRAIN_LIMIT_MS = 120_000; // waiting for the fire-and-forget backlog

const args = benchArgs({
  seconds: { type: 'string', default: '5' },
  warmup: { type: 'string', default: '1' },
  concurrency: { type: 'string', default: '1,16,64' },
  'accept-concurrency': { type: 'string', default: '64' },
  profile: { type: 'boolean', default: false },
  'profile-concurrency': { type: 'string', default: '16' },
  'keep-profile': { type: 'boolean', default: false },
  'allow-non-durable': { type: 'boolean', default: false },
});
const durationMs = Number(args.seconds) * 1000;
const warmupMs = Number(args.warmup) * 1000;
const levels = args.concurrency.split(',').map(Number);
if (!(durationMs > 0) || !(warmupMs >= 0) || levels.some((c) => !Number.isInteger(c) || c < 1)) {
  throw new Error('usage: --seconds N --warmup N --concurrency 1,16,64');
}

const out = (line = '') => process.stdout.write(line + '\n');
const progress = (line: string) => process.stderr.write(`[bench] ${line}\n`);

// Every body distinct (run tag + counter), so idempotency never answers from a stored request.
const TAG = crypto.randomBytes(4).toString('hex');
let counter = 0;
const body = (n: number) => `{"model":"gpt-bench","messages":[{"role":"user","content":"throughput ${TAG} ${n}"}]}`;

type Phase = { result: LoadResult; latency: Summary; cpu: CpuShares | null };
type DbStages = { n: number; pickupP50: number; pickupP99: number; execP50: number; execP99: number };
type Level = { c: number; direct: Phase; via: Phase; stages: DbStages };

async function phase(origin: string, c: number, expect: number, make: (n: number) => LoadRequest, cpu: (() => ReturnType<typeof cpuSnapshot>) | null, signal: AbortSignal): Promise<Phase> {
  let before: ReturnType<typeof cpuSnapshot> | null = null;
  const result = await runLoad({
    origin, concurrency: c, warmupMs, durationMs, expect, signal,
    next: () => make(++counter),
    onMeasureStart: () => void (before = cpu?.() ?? null),
  });
  const after = cpu?.() ?? null;
  return { result, latency: summarise(result.latencies), cpu: before && after ? cpuShares(before, after) : null };
}

/** Submission → claim and claim → finish, on the database clock, for requests created since `since`. */
async function dbStages(pool: pg.Pool, since: Date, until: Date): Promise<DbStages> {
  const { rows } = await pool.query(
    `SELECT count(*)::int AS n,
            percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at)) * 1000 AS pickup_p50,
            percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at)) * 1000 AS pickup_p99,
            percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at)) * 1000 AS exec_p50,
            percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at)) * 1000 AS exec_p99
       FROM sarsen.requests WHERE created_at >= $1 AND created_at < $2 AND status = 'succeeded'`,
    [since, until],
  );
  const r = rows[0];
  return { n: r.n, pickupP50: r.pickup_p50, pickupP99: r.pickup_p99, execP50: r.exec_p50, execP99: r.exec_p99 };
}

const dbNow = async (pool: pg.Pool): Promise<Date> => (await pool.query<{ t: Date }>('SELECT clock_timestamp() AS t')).rows[0]!.t;

const cpuCell = (s: CpuShares | null) => (s ? `${fmt(s.sarsen, 0)}/${fmt(s.postgres, 0)}/${fmt(s.bench, 0)}` : '-');

function report(levelsDone: Level[], accept: { phase: Phase; backlog: number; drainMs: number; executedRate: number } | null): void {
  out('Closed loop, non-streaming, provider answering at once (latencies in ms; CPU = % of one core: sarsen/postgres/bench)');
  out(table(
    ['c', 'direct r/s', 'sarsen r/s', 'ratio', 'dir p50', 'dir p99', 'via p50', 'via p99', '+p50', '+p99', 'non-2xx dir', 'non-2xx via', 'CPU via', 'pickup p50/p99', 'exec p50/p99'],
    levelsDone.map(({ c, direct, via, stages }) => [
      String(c),
      fmt(direct.result.rate, 0),
      fmt(via.result.rate, 0),
      fmt(via.result.rate / direct.result.rate, 3),
      fmt(direct.latency.p50, 2),
      fmt(direct.latency.p99, 2),
      fmt(via.latency.p50, 2),
      fmt(via.latency.p99, 2),
      fmt(via.latency.p50 - direct.latency.p50, 2),
      fmt(via.latency.p99 - direct.latency.p99, 2),
      describeUnexpected(direct.result.unexpected),
      describeUnexpected(via.result.unexpected),
      cpuCell(via.cpu),
      `${fmt(stages.pickupP50, 1)}/${fmt(stages.pickupP99, 1)}`,
      `${fmt(stages.execP50, 1)}/${fmt(stages.execP99, 1)}`,
    ]),
  ));
  out('pickup = requests.started_at − created_at (submission transaction start → executor claim); exec = finished_at − started_at; database clock.');
  out();
  if (accept) {
    const a = accept.phase;
    out(`POST /requests (fire-and-forget) at c=${a.result.concurrency}: ${fmt(a.result.rate, 0)} submissions/s accepted (202), p50 ${fmt(a.latency.p50, 2)} ms, p99 ${fmt(a.latency.p99, 2)} ms, unexpected: ${describeUnexpected(a.result.unexpected)}, CPU ${cpuCell(a.cpu)}`);
    out(`  backlog (pending or running) when the window closed: ${accept.backlog}; drained ${fmt(accept.drainMs / 1000, 1)} s later; executions completed at ${fmt(accept.executedRate, 0)}/s from window start to drain`);
    out();
  }
  const at = (c: number) => levelsDone.find((l) => l.c === c);
  const c64 = at(64);
  const c16 = at(16);
  const rows: string[][] = [];
  const add = (what: string, target: string, value: number, unit: string, t: number, better: 'higher' | 'lower') =>
    rows.push([what, target, Number.isFinite(value) ? `${fmt(value, unit === 'ms' ? 2 : 0)} ${unit}` : '-', verdict(value, t, better, unit)]);
  const c1 = at(1);
  add('added p50 at c=1', `≤ ${TARGETS.addedP50C1} ms`, c1 ? c1.via.latency.p50 - c1.direct.latency.p50 : NaN, 'ms', TARGETS.addedP50C1, 'lower');
  add('added p50 at c=16', `≤ ${TARGETS.addedP50C16} ms`, c16 ? c16.via.latency.p50 - c16.direct.latency.p50 : NaN, 'ms', TARGETS.addedP50C16, 'lower');
  add('added p99 at c=16', `≤ ${TARGETS.addedP99C16} ms`, c16 ? c16.via.latency.p99 - c16.direct.latency.p99 : NaN, 'ms', TARGETS.addedP99C16, 'lower');
  out('Latency targets (docs/performance.md) (throughput against a stateless gateway: npm run bench:compare)');
  out(table(['measure', 'target', 'measured', 'verdict'], rows));
  const bad = levelsDone.some((l) => l.direct.result.unexpected.size + l.via.result.unexpected.size > 0) || (accept?.phase.result.unexpected.size ?? 0) > 0;
  out(bad ? 'Some answers were not 200/202: see the non-2xx columns.' : 'Every answer was 200 (202 for POST /requests).');
  out();
}

async function waitForBacklog(pool: pg.Pool, signal: AbortSignal): Promise<{ backlog: number; drainMs: number }> {
  const count = async () =>
    (await pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM sarsen.requests WHERE status IN ('pending', 'running')`)).rows[0]!.n;
  const backlog = await count();
  const t0 = performance.now();
  while (!signal.aborted && performance.now() - t0 < DRAIN_LIMIT_MS) {
    if ((await count()) === 0) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  return { backlog, drainMs: performance.now() - t0 };
}

async function main(): Promise<void> {
  const abort = new AbortController();
  const onSignal = () => {
    progress('interrupted: finishing the phase in flight, then cleaning up');
    abort.abort();
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const watchdog = setTimeout(() => abort.abort(), HARD_LIMIT_MS);
  watchdog.unref();

  let provider: FakeProvider | null = null;
  let sarsen: BenchSarsen | null = null;
  let pool: pg.Pool | null = null;
  let resetTimer: NodeJS.Timeout | null = null;
  try {
    const db = await benchDatabase({ allowNonDurable: args['allow-non-durable'] });
    provider = await startFakeProvider();
    const p = provider;
    resetTimer = setInterval(() => p.reset(), 1000); // keeps the journal from growing without bound
    progress('starting Sarsen (child process) against a fresh database');
    sarsen = await startBenchSarsen({ settings: { shutdown_grace_ms: 5_000 } });
    pool = createPool(sarsen.db.conn, { max: 2, name: 'sarsen-bench' });
    const tenant: BenchTenant = await provisionChat(sarsen.url, pool, provider.url);
    const postmaster = await postmasterPid(pool).catch(() => null);
    const sarsenPid = sarsen.child.child.pid!;
    const cpu = () => cpuSnapshot(sarsenPid, postmaster);

    out(`Sarsen throughput benchmark — ${new Date().toISOString()}`);
    out(`machine: ${os.cpus().length} × ${os.cpus()[0]?.model ?? '?'}, load average ${os.loadavg().map((l) => fmt(l, 2)).join(' ')}; node ${process.version}`);
    out(`database: ${db.describe}`);
    out(`commit: ${describeCommitLatency(await measureCommitLatency())}`);
    out(`load: closed loop, ${warmupMs / 1000} s warm-up + ${durationMs / 1000} s measured per phase; fake provider in this process; Sarsen ${sarsen.url} (role both, child pid ${sarsenPid})`);
    out();

    const direct = (n: number): LoadRequest => ({
      path: '/v1/chat/completions',
      headers: { 'content-type': 'application/json', authorization: 'Bearer sk-bench-direct' },
      body: body(n),
    });
    const via = (n: number): LoadRequest => ({
      path: `${tenant.basePath}/chat/completions`,
      headers: { 'content-type': 'application/json', 'x-sarsen-key': tenant.key },
      body: body(n),
    });
    const sarsenOrigin = new URL(sarsen.url).origin;
    const providerOrigin = new URL(provider.url).origin;
    const done: Level[] = [];
    for (const c of levels) {
      if (abort.signal.aborted) break;
      progress(`c=${c}: direct`);
      const d = await phase(providerOrigin, c, 200, direct, cpu, abort.signal);
      progress(`c=${c}: direct ${fmt(d.result.rate, 0)}/s; via Sarsen`);
      const since = await dbNow(pool);
      const v = await phase(sarsenOrigin, c, 200, via, cpu, abort.signal);
      const stages = await dbStages(pool, since, await dbNow(pool));
      progress(`c=${c}: via Sarsen ${fmt(v.result.rate, 0)}/s`);
      done.push({ c, direct: d, via: v, stages });
    }

    let accept = null;
    if (!abort.signal.aborted) {
      const ac = Number(args['accept-concurrency']);
      progress(`POST /requests at c=${ac}`);
      const submit = (n: number): LoadRequest => ({ ...via(n), path: `${tenant.basePath}/requests` });
      const since = await dbNow(pool);
      const t0 = performance.now();
      const a = await phase(sarsenOrigin, ac, 202, submit, cpu, abort.signal);
      const { backlog, drainMs } = await waitForBacklog(pool, abort.signal);
      const { rows: ex } = await pool.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM sarsen.requests WHERE created_at >= $1 AND status = 'succeeded'`, [since]);
      const executedRate = (ex[0]!.n * 1000) / (performance.now() - t0);
      accept = { phase: a, backlog, drainMs, executedRate };
      progress(`POST /requests ${fmt(a.result.rate, 0)}/s; backlog ${backlog} drained in ${fmt(drainMs / 1000, 1)} s`);
    }
    out();
    report(done, accept);

    await pool.end();
    pool = null;
    await sarsen.stop();
    sarsen = null;
    if (args.profile && !abort.signal.aborted) {
      out('Profile: where the time goes through Sarsen');
      out('==========================================');
      progress('profile: a second Sarsen child through the counting proxy, with --cpu-prof (about 30 s more)');
      await profileRun({
        providerUrl: provider.url,
        concurrency: Number(args['profile-concurrency']),
        warmupMs: Math.max(warmupMs, 1000),
        durationMs,
        body: (n) => body(n + 1e9),
        signal: abort.signal,
        keepProfile: args['keep-profile'],
        out,
      });
    }
  } finally {
    clearTimeout(watchdog);
    if (resetTimer) clearInterval(resetTimer);
    await pool?.end().catch(() => undefined);
    await sarsen?.stop().catch((err) => progress(`stopping Sarsen failed: ${err}`));
    await provider?.close().catch(() => undefined);
    await shutdownDatabases();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

await main();
