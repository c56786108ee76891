// Streaming through Sarsen versus straight at the provider, in the same run (docs/performance.md
// "Targets": added time to first byte p50 ≤ 3 ms). The concurrency levels show what a growing
// number of live streams costs in frame delay, memory and CPU; the target for 1,000 streams at
// once is judged by bench:compare.
// The provider streams `--frames` frames at a fixed pace and notes when it wrote each one, so a
// frame's delay is its arrival at the caller minus its write, measured in one process.
//
//   latency      closed loop of --latency-streams streams (--pace ms apart, default 10),
//                --latency-concurrency at a time: time to first byte and per-frame delay
//   concurrency  --levels streams (--level-pace ms apart, default 100: ten-second streams that
//                outlast the --ramp over which they are opened, so every level holds all its
//                streams at once for a while), direct then through Sarsen: how many completed,
//                how many were live at once, frame delay, the child's RSS and CPU beside
//                PostgreSQL's and this process's
//
// Run: npm run bench:streaming [-- --levels 100,500,1000 --level-pace 10 --child-env MALLOC_ARENA_MAX=2]
import crypto from 'node:crypto';
import os from 'node:os';
import { performance } from 'node:perf_hooks';
import { shutdownDatabases } from '../test/support/db.ts';
import { benchDatabase } from './lib/database.ts';
import { startPacedProvider, type PacedProvider } from './lib/stream-provider.ts';
import { createAgent, streamOnce, closedLoop, type StreamResult } from './lib/stream-client.ts';
import { startStreamSarsen, provisionStreaming, memoryMb, cpuMs, postgresCpuMs, sampleRss, type StreamSarsen, type StreamTenant } from './lib/stream-sarsen.ts';
import { pct, maxOverlap, ms, textTable } from './lib/stream-stats.ts';
import { benchArgs } from './lib/args.ts';

const TARGETS = { addedTtfbP50Ms: 3 };
const HARD_LIMIT_MS = 20 * 60_000;

const args = benchArgs({
  frames: { type: 'string', default: '100' },
  pace: { type: 'string', default: '10' },
  // The concurrency levels' pace. Streams must outlast the ramp-up for a level to hold all
  // its streams at once: Sarsen starts streams at a bounded rate (docs/performance.md).
  'level-pace': { type: 'string', default: '100' },
  'latency-streams': { type: 'string', default: '200' },
  'latency-concurrency': { type: 'string', default: '8' },
  levels: { type: 'string', default: '100,500,1000' },
  'level-timeout': { type: 'string', default: '180' },
  // Streams of a level are opened over this long: a burst of 1,000 connects in one tick
  // overflows a listen backlog of 511 and measures SYN retransmission instead.
  ramp: { type: 'string', default: '5000' },
  // Extra environment for the Sarsen child, to see what its RSS is made of:
  // --child-env MALLOC_ARENA_MAX=2 --child-env NODE_OPTIONS=--max-semi-space-size=2
  'child-env': { type: 'string', multiple: true, default: [] },
  'allow-non-durable': { type: 'boolean', default: false },
});
const FRAMES = Number(args.frames);
const PACE = Number(args.pace);
const LEVEL_PACE = Number(args['level-pace']);
const LATENCY_STREAMS = Number(args['latency-streams']);
const LATENCY_C = Number(args['latency-concurrency']);
const LEVELS = args.levels.split(',').map(Number);
const LEVEL_TIMEOUT_MS = Number(args['level-timeout']) * 1000;
const RAMP_MS = Number(args.ramp);
const CHILD_ENV: Record<string, string> = Object.fromEntries(
  args['child-env'].map((kv) => {
    const at = kv.indexOf('=');
    if (at < 1) throw new Error(`--child-env takes NAME=VALUE, not ${kv}`);
    return [kv.slice(0, at), kv.slice(at + 1)];
  }),
);
if (![FRAMES, PACE, LEVEL_PACE, LATENCY_STREAMS, LATENCY_C, LEVEL_TIMEOUT_MS, ...LEVELS].every((n) => Number.isInteger(n) && n > 0) || FRAMES < 2) {
  throw new Error('usage: --frames N --pace MS --latency-streams N --latency-concurrency N --levels a,b,c --level-timeout S');
}

const out = (line = '') => process.stdout.write(line + '\n');
const progress = (line: string) => process.stderr.write(`[bench:streaming] ${line}\n`);
const RUN = crypto.randomBytes(3).toString('hex');
let counter = 0;
let pgPort = 0; // the benchmark database server's, for its CPU time

type Side = { name: 'direct' | 'sarsen'; url: string; headers: Record<string, string> };

function send(side: Side, agent: ReturnType<typeof createAgent>, timeoutMs: number, signal?: AbortSignal): Promise<StreamResult> {
  const tag = `s${RUN}-${++counter}`;
  const body = `{"model":"gpt-bench","stream":true,"messages":[{"role":"user","content":"${tag}"}]}`;
  return streamOnce(agent, side.url, { tag, body, headers: side.headers, expectFrames: FRAMES, timeoutMs, signal });
}

/** Per-frame delays (arrival minus the provider's write) of the streams that completed. */
function frameDelays(results: StreamResult[], provider: PacedProvider): number[] {
  const delays: number[] = [];
  for (const r of results) {
    const sent = provider.sent.get(r.tag);
    if (!r.ok || !sent) continue;
    for (let i = 0; i < r.arrivals.length; i++) delays.push(r.arrivals[i]! - sent[i]!);
  }
  return delays;
}

const ttfbs = (results: StreamResult[]) => results.filter((r) => r.ok).map((r) => r.arrivals[0]! - r.startedAt);

function errorSummary(results: StreamResult[]): string {
  const counts = new Map<string, number>();
  for (const r of results) if (!r.ok) counts.set(r.error ?? '?', (counts.get(r.error ?? '?') ?? 0) + 1);
  return [...counts].map(([e, n]) => `${n}× ${e}`).join('; ');
}

async function waitIdle(provider: PacedProvider, limitMs = 30_000): Promise<void> {
  const deadline = Date.now() + limitMs;
  while (provider.active() > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
}

// Time to first byte in two parts: the caller's request reaching the provider (for Sarsen:
// submission, job pick-up, claim, upstream call) and the first frame's trip back.
type LatencyFigures = { ttfb: number[]; toProvider: number[]; firstBack: number[]; delays: number[]; failed: number; pickup?: { p50: number; p99: number } | null };

async function latencyPhase(side: Side, provider: PacedProvider): Promise<LatencyFigures> {
  const agent = createAgent();
  try {
    const results = await closedLoop(LATENCY_STREAMS, LATENCY_C, () => send(side, agent, 60_000));
    const failed = results.filter((r) => !r.ok);
    if (failed.length) progress(`${side.name}: ${failed.length} streams failed: ${errorSummary(results)}`);
    const ok = results.filter((r) => r.ok && provider.received.has(r.tag));
    return {
      ttfb: ttfbs(results),
      toProvider: ok.map((r) => provider.received.get(r.tag)! - r.startedAt),
      firstBack: ok.map((r) => r.arrivals[0]! - provider.sent.get(r.tag)![0]!),
      delays: frameDelays(results, provider),
      failed: failed.length,
    };
  } finally {
    agent.destroy();
  }
}

type LevelFigures = {
  n: number; ok: number; errors: string; wallMs: number; liveAtOnce: number; providerAtOnce: number;
  delayP50: number; delayP99: number; ttfbP50: number; ttfbP99: number; benchCores: number; pgCores: number; rssPeak?: number; cpuCores?: number;
};

async function levelPhase(side: Side, n: number, provider: PacedProvider, sarsen: StreamSarsen | null): Promise<LevelFigures> {
  const agent = createAgent();
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), LEVEL_TIMEOUT_MS);
  provider.resetPeak();
  const rss = sarsen ? sampleRss(sarsen.pid) : null;
  const cpu0 = sarsen ? cpuMs(sarsen.pid) : NaN;
  const pg0 = postgresCpuMs(pgPort);
  const own0 = process.cpuUsage();
  const t0 = performance.now();
  try {
    const opened = (i: number) => new Promise<void>((r) => setTimeout(r, (i * RAMP_MS) / n));
    const results = await Promise.all(Array.from({ length: n }, (_, i) => opened(i).then(() => send(side, agent, LEVEL_TIMEOUT_MS, abort.signal))));
    const wallMs = performance.now() - t0;
    const own = process.cpuUsage(own0);
    // Backends that exited during the phase take their CPU time with them: a floor, not exact.
    const pgCores = Math.max(0, (postgresCpuMs(pgPort) - pg0) / wallMs);
    const delays = frameDelays(results, provider);
    const tt = ttfbs(results);
    const live = results.filter((r) => r.arrivals.length > 0).map((r) => [r.arrivals[0]!, r.arrivals[r.arrivals.length - 1]!] as const);
    return {
      n, ok: results.filter((r) => r.ok).length, errors: errorSummary(results), wallMs,
      liveAtOnce: maxOverlap(live), providerAtOnce: provider.peak(),
      delayP50: pct(delays, 50), delayP99: pct(delays, 99), ttfbP50: pct(tt, 50), ttfbP99: pct(tt, 99),
      benchCores: (own.user + own.system) / 1000 / wallMs, pgCores,
      ...(sarsen ? { rssPeak: rss!.stop(), cpuCores: (cpuMs(sarsen.pid) - cpu0) / wallMs } : {}),
    };
  } finally {
    clearTimeout(timer);
    rss?.stop();
    agent.destroy();
    await waitIdle(provider);
  }
}

// The child, for the hard limit to kill (its streams then fail fast and main() cleans up).
let running: StreamSarsen | null = null;

async function main(): Promise<void> {
  const db = await benchDatabase({ allowNonDurable: args['allow-non-durable'] });
  progress(`database: ${db.describe}`);
  const provider = await startPacedProvider({ frames: FRAMES, paceMs: PACE });
  let sarsen: StreamSarsen | null = null;
  try {
    progress('starting a Sarsen child process (role both) on a fresh database');
    sarsen = running = await startStreamSarsen({ env: CHILD_ENV });
    const tenant: StreamTenant = await provisionStreaming(sarsen, provider.url);
    pgPort = sarsen.db.conn.port;
    const direct: Side = { name: 'direct', url: `${provider.url}/v1/chat/completions`, headers: {} };
    const via: Side = { name: 'sarsen', url: `${sarsen.url}${tenant.path}`, headers: { 'x-sarsen-key': tenant.key } };

    progress('warming up');
    for (const side of [direct, via]) {
      const agent = createAgent();
      await closedLoop(16, 4, () => send(side, agent, 60_000));
      agent.destroy();
    }
    const rssAfterWarmup = memoryMb(sarsen.pid).rss;

    progress(`latency: ${LATENCY_STREAMS} streams of ${FRAMES} frames ${PACE} ms apart, ${LATENCY_C} at a time, each side`);
    const directLat = await latencyPhase(direct, provider);
    const viaSince = new Date();
    const lat = { direct: directLat, via: await latencyPhase(via, provider) };
    const pickup = await sarsen.pool.query<{ p50: number; p99: number }>(
      `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at)) * 1000 AS p50,
              percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at)) * 1000 AS p99
         FROM sarsen.requests WHERE created_at >= $1`,
      [viaSince],
    );
    lat.via.pickup = pickup.rows[0] ?? null;

    const levels: { direct: LevelFigures; via: LevelFigures }[] = [];
    provider.setPace(LEVEL_PACE);
    for (const n of LEVELS) {
      progress(`concurrency: ${n} streams at once, direct`);
      const d = await levelPhase(direct, n, provider, null);
      progress(`concurrency: ${n} streams at once, through Sarsen`);
      const v = await levelPhase(via, n, provider, sarsen);
      levels.push({ direct: d, via: v });
      progress(`  ${v.ok}/${n} completed in ${ms(v.wallMs / 1000, 1)} s, ${v.liveAtOnce} live at once, peak RSS ${ms(v.rssPeak ?? NaN, 0)} MB`);
    }
    const hwm = memoryMb(sarsen.pid).hwm;
    report(lat, levels, rssAfterWarmup, hwm);
  } finally {
    progress('cleaning up');
    await sarsen?.stop();
    await provider.close();
    await shutdownDatabases();
  }
}

function report(lat: { direct: LatencyFigures; via: LatencyFigures }, levels: { direct: LevelFigures; via: LevelFigures }[], rssAfterWarmup: number, hwm: number): void {
  const nominal = (FRAMES - 1) * PACE;
  out();
  out(`Streaming: ${FRAMES} frames ${PACE} ms apart (nominal stream ${nominal} ms); ${os.cpus().length} CPUs, load average ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}`);
  out(`Sarsen: one child process, role both${args['child-env'].length ? ` (environment ${args['child-env'].join(' ')})` : ''}; PostgreSQL, the provider and the callers on the same machine.`);
  out();
  out(`Latency (${LATENCY_STREAMS} streams per side, ${LATENCY_C} at a time; failed: direct ${lat.direct.failed}, Sarsen ${lat.via.failed})`);
  const row = (name: string, d: number[], v: number[], p: number, target?: string) => {
    const a = pct(d, p);
    const b = pct(v, p);
    return [name, ms(a), ms(b), ms(b - a), target ?? ''];
  };
  const addedTtfb = pct(lat.via.ttfb, 50) - pct(lat.direct.ttfb, 50);
  out(textTable(['measure (ms)', 'direct', 'Sarsen', 'added', 'target'], [
    row('time to first byte p50', lat.direct.ttfb, lat.via.ttfb, 50, `≤ ${TARGETS.addedTtfbP50Ms} added: ${addedTtfb <= TARGETS.addedTtfbP50Ms ? 'met' : `MISSED by ${ms(addedTtfb - TARGETS.addedTtfbP50Ms)} ms`}`),
    row('time to first byte p99', lat.direct.ttfb, lat.via.ttfb, 99),
    row('  request to provider p50', lat.direct.toProvider, lat.via.toProvider, 50),
    row('  first frame back p50', lat.direct.firstBack, lat.via.firstBack, 50),
    ['  of which submission to claim p50 / p99 (database clock)', '', `${ms(lat.via.pickup?.p50 ?? NaN)} / ${ms(lat.via.pickup?.p99 ?? NaN)}`, '', ''],
    row('per-frame delay p50', lat.direct.delays, lat.via.delays, 50),
    row('per-frame delay p99', lat.direct.delays, lat.via.delays, 99),
  ]));
  out();
  out(`Concurrent streams of ${FRAMES} frames ${LEVEL_PACE} ms apart, opened over ${RAMP_MS} ms (frame delay = arrival minus the provider's write; ttfb from each stream's own start)`);
  const rows: string[][] = [];
  for (const { direct: d, via: v } of levels) {
    for (const f of [d, v]) {
      rows.push([
        `${f.n} ${f === d ? 'direct' : 'Sarsen'}`, `${f.ok}/${f.n}`, String(f.providerAtOnce), String(f.liveAtOnce), ms(f.wallMs / 1000, 1),
        ms(f.ttfbP50, 1), ms(f.ttfbP99, 1), ms(f.delayP50, 1), ms(f.delayP99, 1),
        f.rssPeak === undefined ? '' : ms(f.rssPeak, 0), f.cpuCores === undefined ? '' : ms(f.cpuCores, 2), ms(f.pgCores, 2), ms(f.benchCores, 2),
      ]);
    }
  }
  out(textTable(['streams', 'completed', 'provider at once', 'caller live at once', 'wall s', 'ttfb p50', 'ttfb p99', 'delay p50', 'delay p99', 'Sarsen RSS peak MB', 'CPU cores: Sarsen', 'PostgreSQL', 'callers+provider'], rows));
  for (const { via } of levels) if (via.errors) out(`  ${via.n} through Sarsen: ${via.errors}`);
  out();
  out(`Sarsen RSS after warm-up ${ms(rssAfterWarmup, 0)} MB; VmHWM (peak over the whole run) ${ms(hwm, 0)} MB`);
}

const hardLimit = setTimeout(() => {
  progress(`hard limit of ${HARD_LIMIT_MS / 60_000} min reached; killing the child and cleaning up`);
  process.exitCode = 2;
  running?.child.child.kill('SIGKILL');
  setTimeout(() => process.exit(2), 60_000).unref();
}, HARD_LIMIT_MS);
hardLimit.unref();
main().then(
  () => clearTimeout(hardLimit),
  (err) => {
    clearTimeout(hardLimit);
    process.stderr.write(`${err instanceof Error ? err.stack : String(err)}\n`);
    process.exitCode = 1;
  },
);
