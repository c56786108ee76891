// The side-by-side benchmark (issue 13; DESIGN.md section 6): the same provider called
// directly, through a stateless gateway (Portkey's open-source gateway, no storage), and
// through Sarsen (role both, every request durable), in one run on one machine, with wrk as
// the load generator and every request body distinct. Targets are ratios against the gateway
// measured in the same run, because machines differ about 2x in absolute figures.
//
//   non-streaming   closed loop at --concurrency (default 1,16,64) on each side
//   acceptance      POST /requests at c=64, then the backlog it accepted drained to terminal states
//   streams         --streams (default 256) concurrent streams of 50 frames 20 ms apart
//                   (1.0 s at the provider) on each side: stream duration and timeouts
//   many streams    --many (default 1000) streams opened at once, each once, directly and through
//                   Sarsen: whether all complete, how long they take, and Sarsen's peak RSS
//
// Run: npm run bench:compare [-- --seconds 8 --warmup 2 --concurrency 1,16,64 --phases nonstream,accept,streams,many --allow-non-durable]
// Needs wrk (Debian: apt-get install wrk). PostgreSQL must be durable (see lib/database.ts).
import os from 'node:os';
import path from 'node:path';
import crypto from 'node:crypto';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import { shutdownDatabases } from '../test/support/db.ts';
import { spawnNode, type SarsenChild } from '../test/support/child.ts';
import { createPool } from '../src/db/pool.ts';
import { benchDatabase } from './lib/database.ts';
import { startGateway, type Gateway } from './lib/gateway.ts';
import { startBenchSarsen, SARSEN_RUNTIME_ENV, type BenchSarsen } from './lib/sarsen-child.ts';
import { provisionChat } from './lib/provision.ts';
import { runWrk, wrkVersion, describeFailures, type WrkResult } from './lib/wrk.ts';
import { processCpuMs, postmasterPid, serverCpuMs } from './lib/cpu.ts';
import { sampleRss } from './lib/stream-sarsen.ts';
import { createAgent, streamOnce } from './lib/stream-client.ts';
import { summarise } from './lib/stats.ts';
import { fmt, table, verdict } from './lib/stats.ts';

const { values: args } = parseArgs({
  options: {
    seconds: { type: 'string', default: '8' },
    warmup: { type: 'string', default: '2' },
    concurrency: { type: 'string', default: '1,16,64' },
    'accept-concurrency': { type: 'string', default: '64' },
    streams: { type: 'string', default: '256' },
    many: { type: 'string', default: '1000' },
    'stream-seconds': { type: 'string', default: '10' },
    // A subset of the phases, for working on one target: --phases accept,many
    phases: { type: 'string', default: 'nonstream,accept,streams,many' },
    'allow-non-durable': { type: 'boolean', default: false },
    // Environment of the Sarsen children beyond the runtime settings they get anyway
    // (SARSEN_RUNTIME_ENV): --child-env NODE_OPTIONS=--max-semi-space-size=8
    'child-env': { type: 'string', multiple: true, default: [] },
  },
});
const SECONDS = Number(args.seconds);
const WARMUP = Number(args.warmup);
const LEVELS = args.concurrency.split(',').map(Number);
const ACCEPT_C = Number(args['accept-concurrency']);
const STREAMS = Number(args.streams);
const MANY = Number(args.many);
const STREAM_SECONDS = Number(args['stream-seconds']);
const PHASES = new Set(args.phases.split(','));
for (const p of PHASES) if (!['nonstream', 'accept', 'streams', 'many'].includes(p)) throw new Error(`unknown phase ${p}; the phases are nonstream, accept, streams, many`);
if (![SECONDS, WARMUP, ACCEPT_C, STREAMS, MANY, STREAM_SECONDS, ...LEVELS].every((n) => Number.isInteger(n) && n >= 0) || SECONDS < 1) {
  throw new Error('usage: --seconds N --warmup N --concurrency 1,16,64 --streams N --many N --stream-seconds N');
}
const CHILD_ENV: Record<string, string> = {
  ...SARSEN_RUNTIME_ENV,
  ...Object.fromEntries(
    args['child-env'].map((kv) => {
      const at = kv.indexOf('=');
      if (at < 1) throw new Error(`--child-env takes NAME=VALUE, not ${kv}`);
      return [kv.slice(0, at), kv.slice(at + 1)];
    }),
  ),
};
const describeRuntime = (env: Record<string, string>) => Object.entries(env).map(([k, v]) => `${k}=${v}`).join(' ');
const FRAMES = 50;
const PACE_MS = 20;
const DRAIN_LIMIT_MS = 180_000;

const out = (line = '') => process.stdout.write(line + '\n');
const progress = (line: string) => process.stderr.write(`[bench:compare] ${line}\n`);
const HERE = path.dirname(fileURLToPath(import.meta.url));
const TAG = crypto.randomBytes(4).toString('hex'); // bodies distinct across runs, too

type Side = { name: 'direct' | 'gateway' | 'sarsen'; url: string; headers: Record<string, string>; pid: number };
type Measured = WrkResult & { cpu: number; pgCpu: number };

const chatBody = (stream: boolean) => `{"model":"gpt-bench",${stream ? '"stream":true,' : ''}"messages":[{"role":"user","content":"compare ${TAG} {n}"}]}`;

async function startProvider(): Promise<{ url: string; child: SarsenChild }> {
  const child = spawnNode(path.join(HERE, 'lib/provider-process.ts'), ['--frames', String(FRAMES), '--pace', String(PACE_MS)], process.env, 'bench provider');
  const [, url] = await child.waitFor(/listening (http:\S+)/, 30_000);
  return { url: url!, child };
}

type SarsenUnderTest = { sarsen: BenchSarsen; pool: pg.Pool; side: Side; postmaster: number | null };

/** A Sarsen child (role both) on a fresh database, provisioned with a key on the provider. */
async function startSarsen(providerUrl: string): Promise<SarsenUnderTest> {
  const sarsen = await startBenchSarsen({ settings: { shutdown_grace_ms: 5_000 }, env: CHILD_ENV });
  const pool = createPool(sarsen.db.conn, { max: 2, name: 'sarsen-bench' });
  const tenant = await provisionChat(sarsen.url, pool, providerUrl);
  const side: Side = {
    name: 'sarsen',
    url: `${sarsen.url}${tenant.basePath}/chat/completions`,
    headers: { 'content-type': 'application/json', 'x-sarsen-key': tenant.key },
    pid: sarsen.child.child.pid!,
  };
  return { sarsen, pool, side, postmaster: await postmasterPid(pool).catch(() => null) };
}

async function stopSarsen(s: SarsenUnderTest | null): Promise<void> {
  if (!s) return;
  await s.pool.end().catch(() => undefined);
  await s.sarsen.stop().catch((err) => progress(`stopping Sarsen failed: ${err}`));
}

async function main(): Promise<void> {
  const db = await benchDatabase({ allowNonDurable: args['allow-non-durable'] });
  const wrk = wrkVersion();
  if (!wrk) throw new Error('wrk is not installed (Debian: apt-get install wrk); the side-by-side benchmark uses it as its load generator.');
  let provider: { url: string; child: SarsenChild } | null = null;
  let gateway: Gateway | null = null;
  let under: SarsenUnderTest | null = null;
  try {
    provider = await startProvider();
    gateway = await startGateway();
    progress('starting Sarsen (role both) against a fresh database');
    under = await startSarsen(provider.url);

    out(`Sarsen side-by-side benchmark — ${new Date().toISOString()}`);
    out(`machine: ${os.cpus().length} × ${os.cpus()[0]?.model ?? '?'}, ${Math.round(os.totalmem() / 2 ** 30)} GiB, load average ${os.loadavg().map((l) => fmt(l, 2)).join(' ')}`);
    out(`node ${process.version}; load generator ${wrk}; gateway @portkey-ai/gateway ${gateway.version}; provider: a Node process answering at once (streams: ${FRAMES} frames ${PACE_MS} ms apart)`);
    out(`database: ${db.describe}`);
    out(`Sarsen: role both, ${describeRuntime(CHILD_ENV)}; a fresh process for the request/response phases and another for the streaming ones; ${SECONDS} s measured after ${WARMUP} s of warm-up per phase; every body distinct`);
    out();

    const auth = { authorization: 'Bearer sk-bench-direct', 'content-type': 'application/json' };
    const direct: Side = { name: 'direct', url: `${provider.url}/v1/chat/completions`, headers: auth, pid: provider.child.child.pid! };
    const viaGateway: Side = { name: 'gateway', url: `${gateway.url}/v1/chat/completions`, headers: { ...auth, ...gateway.headers(provider.url) }, pid: gateway.pid };

    const measure = async (side: Side, c: number, body: string, seconds: number, warmup: number, url = side.url): Promise<Measured> => {
      const load = { url, headers: side.headers, body, connections: c, timeoutS: 10 };
      if (warmup > 0) await runWrk({ ...load, durationS: warmup });
      const postmaster = under!.postmaster;
      const cpu0 = processCpuMs(side.pid);
      const pg0 = serverCpuMs(postmaster);
      const t0 = performance.now();
      const r = await runWrk({ ...load, durationS: seconds });
      const wall = performance.now() - t0;
      return { ...r, cpu: (processCpuMs(side.pid) - cpu0) / wall, pgCpu: (serverCpuMs(postmaster) - pg0) / wall };
    };

    // Non-streaming, closed loop.
    const nonStream = new Map<number, Map<string, Measured>>();
    for (const c of PHASES.has('nonstream') ? LEVELS : []) {
      const row = new Map<string, Measured>();
      for (const side of [direct, viaGateway, under.side]) {
        progress(`non-streaming c=${c}: ${side.name}`);
        row.set(side.name, await measure(side, c, chatBody(false), SECONDS, WARMUP));
      }
      nonStream.set(c, row);
    }

    // Fire-and-forget acceptance, then the backlog drained.
    let acceptance: Report['acceptance'] = null;
    if (PHASES.has('accept')) {
      let gateway = nonStream.get(ACCEPT_C)?.get('gateway');
      if (!gateway) {
        progress(`non-streaming c=${ACCEPT_C}: gateway (the acceptance target's comparator)`);
        gateway = await measure(viaGateway, ACCEPT_C, chatBody(false), SECONDS, WARMUP);
      }
      progress(`POST /requests at c=${ACCEPT_C}`);
      const acceptStart = await dbNow(under.pool);
      const accepted = await measure(under.side, ACCEPT_C, chatBody(false), SECONDS, 0, under.side.url.replace(/\/chat\/completions$/, '/requests'));
      const drain = await drained(under.pool, acceptStart);
      progress(`accepted ${fmt(accepted.rate, 0)}/s; backlog ${drain.backlog} drained in ${fmt(drain.ms / 1000, 1)} s`);
      acceptance = { accepted, drain, gateway };
    }

    // Streams, through a fresh Sarsen process.
    if (PHASES.has('streams') || PHASES.has('many')) {
      await stopSarsen(under);
      under = null;
      progress('starting a fresh Sarsen for the streaming phases');
      under = await startSarsen(provider.url);
    }
    const streams = new Map<string, Measured>();
    for (const side of PHASES.has('streams') ? [direct, viaGateway, under.side] : []) {
      progress(`${STREAMS} concurrent streams: ${side.name}`);
      streams.set(side.name, await measure(side, STREAMS, chatBody(true), STREAM_SECONDS, 2));
    }
    const many = new Map<string, Burst>();
    for (const side of PHASES.has('many') ? [direct, under.side] : []) {
      progress(`${MANY} streams opened at once: ${side.name}`);
      many.set(side.name, await burst(side, MANY));
    }

    report({ nonStream, acceptance, streams, many });
  } finally {
    progress('cleaning up');
    await stopSarsen(under);
    await gateway?.stop().catch(() => undefined);
    await provider?.child.kill('SIGTERM');
    await shutdownDatabases();
  }
}

type Burst = { completed: number; failures: string; p50Ms: number; p99Ms: number; maxMs: number; wallMs: number; peakRssMb: number };

/** `n` streams opened at the same moment, each once (not a closed loop): do they all complete, and in how long. */
async function burst(side: Side, n: number): Promise<Burst> {
  const agent = createAgent();
  const rss = sampleRss(side.pid, 50);
  const t0 = performance.now();
  try {
    const results = await Promise.all(
      Array.from({ length: n }, (_, i) =>
        streamOnce(agent, side.url, { tag: `${i}`, body: chatBody(true).replace('{n}', `burst-${crypto.randomBytes(4).toString('hex')}-${i}`), headers: side.headers, expectFrames: FRAMES, timeoutMs: 60_000 }),
      ),
    );
    const wallMs = performance.now() - t0;
    const ok = results.filter((r) => r.ok);
    const failed = new Map<string, number>();
    for (const r of results) if (!r.ok) failed.set(r.error ?? '?', (failed.get(r.error ?? '?') ?? 0) + 1);
    const durations = summarise(ok.map((r) => r.arrivals[r.arrivals.length - 1]! - r.startedAt));
    return {
      completed: ok.length,
      failures: failed.size === 0 ? 'none' : [...failed].map(([e, k]) => `${k}× ${e}`).join('; '),
      p50Ms: durations.p50,
      p99Ms: durations.p99,
      maxMs: durations.max,
      wallMs,
      peakRssMb: rss.stop(),
    };
  } finally {
    rss.stop();
    agent.destroy();
  }
}

const dbNow = async (pool: pg.Pool): Promise<Date> => (await pool.query<{ t: Date }>('SELECT clock_timestamp() AS t')).rows[0]!.t;

/** Waits until nothing accepted since `since` is pending or running; answers the backlog at the start and how long it took. */
async function drained(pool: pg.Pool, since: Date): Promise<{ backlog: number; ms: number; executions: number; rate: number }> {
  const count = async () =>
    (await pool.query<{ open: number; done: number }>(
      `SELECT count(*) FILTER (WHERE status IN ('pending', 'running'))::int AS open, count(*) FILTER (WHERE status = 'succeeded')::int AS done
         FROM sarsen.requests WHERE created_at >= $1`,
      [since],
    )).rows[0]!;
  const t0 = performance.now();
  const backlog = (await count()).open;
  let last = { open: backlog, done: 0 };
  while (last.open > 0 && performance.now() - t0 < DRAIN_LIMIT_MS) {
    await new Promise((r) => setTimeout(r, 100));
    last = await count();
  }
  const ms = performance.now() - t0;
  return { backlog: last.open > 0 ? -backlog : backlog, ms, executions: last.done, rate: last.done / ((SECONDS * 1000 + ms) / 1000) };
}

type Report = {
  nonStream: Map<number, Map<string, Measured>>;
  acceptance: { accepted: Measured; gateway: Measured; drain: { backlog: number; ms: number; executions: number; rate: number } } | null;
  streams: Map<string, Measured>;
  many: Map<string, Burst>;
};

function report(r: Report): void {
  const cores = (m: Measured) => `${fmt(m.cpu, 2)} / ${fmt(m.pgCpu, 2)}`;
  const gw = (c: number) => r.nonStream.get(c)?.get('gateway');
  const via = (c: number) => r.nonStream.get(c)?.get('sarsen');
  const dir = (c: number) => r.nonStream.get(c)?.get('direct');
  const failed = (m: Measured | undefined) => (m ? m.non2xx + m.errors.connect + m.errors.read + m.errors.write + m.errors.timeout : NaN);
  const targets: string[][] = [];

  if (PHASES.has('nonstream')) {
    out('Non-streaming, closed loop, provider answering at once (latency in ms; CPU in cores: the side\'s process / PostgreSQL)');
    const rows: string[][] = [];
    for (const [c, row] of r.nonStream) {
      const direct = row.get('direct')!;
      for (const [name, m] of row) {
        rows.push([
          String(c), name, fmt(m.rate, 0), name === 'direct' ? '' : fmt(m.rate / row.get('gateway')!.rate, 2),
          fmt(m.p50Ms, 2), fmt(m.p90Ms, 2), fmt(m.p99Ms, 2), name === 'direct' ? '' : fmt(m.p50Ms - direct.p50Ms, 2),
          name === 'direct' ? '' : fmt(m.p99Ms - direct.p99Ms, 2), describeFailures(m), cores(m),
        ]);
      }
    }
    out(table(['c', 'side', 'req/s', '× gateway', 'p50', 'p90', 'p99', '+p50', '+p99', 'failures', 'CPU'], rows));
    out();
    const added = (c: number, p: 'p50Ms' | 'p99Ms') => {
      const m = via(c);
      if (!m) return NaN; // not measured
      if (m.requests === 0) return Infinity; // nothing completed: MISSED, not a negative figure
      return m[p] - (dir(c)?.[p] ?? NaN);
    };
    const ratio64 = (via(64)?.rate ?? NaN) / (gw(64)?.rate ?? NaN);
    targets.push(
      ['non-stream req/s at c=64, × the gateway', '≥ 1.0', fmt(ratio64, 2), verdict(ratio64, 1, 'higher', '×')],
      ['added latency p50 at c=1', '≤ 2 ms', fmt(added(1, 'p50Ms'), 2), verdict(added(1, 'p50Ms'), 2, 'lower', 'ms')],
      ['added latency p50 at c=16', '≤ 10 ms', fmt(added(16, 'p50Ms'), 2), verdict(added(16, 'p50Ms'), 10, 'lower', 'ms')],
      ['added latency p99 at c=16', '≤ 40 ms', fmt(added(16, 'p99Ms'), 2), verdict(added(16, 'p99Ms'), 40, 'lower', 'ms')],
    );
  }

  if (r.acceptance) {
    const { accepted: a, drain, gateway } = r.acceptance;
    out(`POST /requests (fire-and-forget) at c=${a.connections}: ${fmt(a.rate, 0)} accepted/s (p50 ${fmt(a.p50Ms, 2)} ms, p99 ${fmt(a.p99Ms, 2)} ms, failures: ${describeFailures(a)}, CPU ${cores(a)}); the gateway at c=${ACCEPT_C}: ${fmt(gateway.rate, 0)} req/s`);
    out(drain.backlog >= 0
      ? `  backlog when the window closed: ${drain.backlog}; drained ${fmt(drain.ms / 1000, 1)} s later; ${drain.executions} executions completed (${fmt(drain.rate, 0)}/s from window start to drain)`
      : `  backlog of ${-drain.backlog} NOT drained within ${DRAIN_LIMIT_MS / 1000} s`);
    out();
    targets.push(
      [`POST /requests acceptance, × the gateway at c=${ACCEPT_C}`, '≥ 2.0', fmt(a.rate / gateway.rate, 2), verdict(a.rate / gateway.rate, 2, 'higher', '×')],
      ['  and its backlog drained', 'yes', drain.backlog >= 0 ? 'yes' : 'no', drain.backlog >= 0 ? 'met' : 'MISSED'],
    );
  }

  if (PHASES.has('streams')) {
    out(`${STREAMS} concurrent streams, ${FRAMES} frames ${PACE_MS} ms apart (${(FRAMES - 1) * PACE_MS / 1000} s at the provider); duration = request to last byte, in ms`);
    const directStream = r.streams.get('direct')!;
    out(table(
      ['side', 'streams/s', 'p50', 'p90', 'p99', 'max', '× direct p50', 'failures', 'CPU'],
      [...r.streams].map(([name, m]) => [name, fmt(m.rate, 1), fmt(m.p50Ms, 0), fmt(m.p90Ms, 0), fmt(m.p99Ms, 0), fmt(m.maxMs, 0), fmt(m.p50Ms / directStream.p50Ms, 3), describeFailures(m), cores(m)]),
    ));
    const ratio = (r.streams.get('sarsen')?.p50Ms ?? NaN) / directStream.p50Ms;
    targets.push(
      [`${STREAMS} streams: median duration, × the provider's`, '≤ 1.1', fmt(ratio, 3), verdict(ratio, 1.1, 'lower', '×')],
      [`${STREAMS} streams: timeouts and failures`, '0', String(failed(r.streams.get('sarsen'))), failed(r.streams.get('sarsen')) === 0 ? 'met' : 'MISSED'],
    );
  }

  if (PHASES.has('many')) {
    out(`${MANY} streams opened at once, each once (duration in ms; RSS of the side's process)`);
    out(table(
      ['side', 'completed', 'p50', 'p99', 'max', 'all done after', 'failures', 'peak RSS MB'],
      [...r.many].map(([name, b]) => [name, `${b.completed}/${MANY}`, fmt(b.p50Ms, 0), fmt(b.p99Ms, 0), fmt(b.maxMs, 0), fmt(b.wallMs, 0), b.failures, fmt(b.peakRssMb, 0)]),
    ));
    const manyVia = r.many.get('sarsen')!;
    targets.push(
      [`${MANY} streams at once: completed`, `${MANY}`, String(manyVia.completed), manyVia.completed === MANY ? 'met' : 'MISSED'],
      [`${MANY} streams at once: peak RSS`, '≤ 300 MB', fmt(manyVia.peakRssMb, 0), verdict(manyVia.peakRssMb, 300, 'lower', 'MB')],
    );
  }
  out();
  out('Targets (issue 13, DESIGN.md section 6)');
  out(table(['measure', 'target', 'measured', 'verdict'], targets));
}

await main();
