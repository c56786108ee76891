// The side-by-side benchmark (docs/performance.md): the same provider called directly, through
// a stateless gateway (Portkey's open-source gateway, no storage), and through Sarsen (role
// both, every request durable), in one run on one machine, with wrk as the load generator and
// every request body distinct. Targets are ratios against the gateway measured in the same
// run, because machines differ in absolute figures (docs/performance.md "Targets"). The
// nonstream and longstreams phases also measure a bare Node relay that stores nothing
// (lib/relay-process.ts): the least any Node proxy spends on this machine; at c=1, the same
// relay made durable (two one-row commits around the provider call): the least a durable one adds.
//
//   nonstream     closed loop at --concurrency (default 1,16,64) on each side, with each side's
//                 slowest request and how many took over a second; --rounds (3) rounds, each
//                 measuring every side at every level in turn: each target is judged by the
//                 median of the rounds' own figures, so that the machine's drift between runs
//                 minutes apart (a tenth and more) weighs on both sides alike
//   accept        POST /requests at c=64 (after a warm-up of its own), then the backlog it accepted
//                 drained to terminal states; then twice more each with a key that has rate limits
//                 (set too high to refuse) and without, in turn: what the limit check costs
//   cache         c=1 pairs through a namespace with the response cache: a distinct body (a
//                 provider call), then the same body again (answered from the cache)
//   streams       --concurrent-streams (default 256) concurrent streams of 50 frames 20 ms apart
//                 (1.0 s at the provider) on each side: stream duration and timeouts
//   many          --many (default 1000) streams opened at once, each once, directly and through
//                 Sarsen: whether all complete, how long they take, and Sarsen's peak RSS
//   longstreams   --streams (default 2000) streams of --frames (300) frames --frame-ms (30) apart,
//                 opened evenly over --arrival-s (10), on each side: time to first frame, delay
//                 between frames, duration, every byte compared, CPU per frame, peak RSS, and
//                 Sarsen's database writes per frame
//   processes     Sarsen with --processes 1, then 2, at c=64: the throughput ratio
//   capacity      bench/capacity.ts, run after the rest has stopped, with the proxy pinned to a
//                 core of its own (its defaults; --allow-non-durable, --sarsen-arg and
//                 --child-env passed on, and --capacity-arg)
//
// Sarsen runs with --processes 1 (--sarsen-processes N for the phases but the last).
// Run: npm run bench:compare [-- --seconds 8 --warmup 2 --concurrency 1,16,64 --rounds 3 --phases nonstream,accept,cache,streams,many,longstreams,processes,capacity --allow-non-durable]
// Needs wrk (Debian: apt-get install wrk) but for the cache and many phases. PostgreSQL must be
// durable (see lib/database.ts).
import os from 'node:os';
import http from 'node:http';
import path from 'node:path';
import crypto from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { spawnSync } from 'node:child_process';
import type pg from 'pg';
import { createTestDatabase, shutdownDatabases, type TestDatabase } from '../test/support/db.ts';
import { spawnNode, type SarsenChild } from '../test/support/child.ts';
import { createPool } from '../src/db/pool.ts';
import { benchDatabase } from './lib/database.ts';
import { describeCommitLatency, measureCommitLatency, measureCommitNow } from './lib/commit-latency.ts';
import { startGateway, type Gateway } from './lib/gateway.ts';
import { startBenchSarsen, type BenchSarsen, childEnv } from './lib/sarsen-child.ts';
import { provisionChat } from './lib/provision.ts';
import { runWrk, wrkVersion, describeFailures, type WrkResult } from './lib/wrk.ts';
import { machineCpuMs, postmasterPid, serverCpuMs } from './lib/cpu.ts';
import { treeCpuMs, sampleTreeRss } from './lib/process-tree.ts';
import { createAgent, streamOnce } from './lib/stream-client.ts';
import { runLongStreams, longStreamsReport, type LongResult, type LongShape, type LongSide } from './lib/long-streams.ts';
import { summarise, fmt, median, table, verdict } from './lib/stats.ts';
import { startSpanCollector, type SpanCollector, type TraceWindow } from './lib/trace-report.ts';
import { benchArgs } from './lib/args.ts';

const PHASE_NAMES = ['nonstream', 'accept', 'cache', 'streams', 'many', 'longstreams', 'processes', 'capacity'];
const args = benchArgs({
  seconds: { type: 'string', default: '8' },
  warmup: { type: 'string', default: '2' },
  concurrency: { type: 'string', default: '1,16,64' },
  rounds: { type: 'string', default: '3' },
  'accept-concurrency': { type: 'string', default: '64' },
  'concurrent-streams': { type: 'string', default: '256' },
  many: { type: 'string', default: '1000' },
  'stream-seconds': { type: 'string', default: '10' },
  streams: { type: 'string', default: '2000' },
  frames: { type: 'string', default: '300' },
  'frame-ms': { type: 'string', default: '30' },
  'arrival-s': { type: 'string', default: '10' },
  'sarsen-processes': { type: 'string', default: '1' },
  // Sarsen exports every span to this process (lib/trace-report.ts); the slowest requests' milestones are printed at the end.
  trace: { type: 'boolean', default: false },
  // A subset of the phases, for working on one target: --phases accept,many
  phases: { type: 'string', default: PHASE_NAMES.join(',') },
  'allow-non-durable': { type: 'boolean', default: false },
  // Environment of the Sarsen children beyond the runtime settings they get anyway
  // (SARSEN_RUNTIME_ENV): --child-env NODE_OPTIONS=--max-semi-space-size=8
  'child-env': { type: 'string', multiple: true, default: [] },
  // Flags added to every Sarsen child's command line: --sarsen-arg=--executor-concurrency=4096
  'sarsen-arg': { type: 'string', multiple: true, default: [] },
  // Flags for the capacity phase beyond those passed on: --capacity-arg=--streams=100,200
  'capacity-arg': { type: 'string', multiple: true, default: [] },
});
const SECONDS = Number(args.seconds);
const WARMUP = Number(args.warmup);
const LEVELS = args.concurrency.split(',').map(Number);
const ROUNDS = Number(args.rounds);
const ACCEPT_C = Number(args['accept-concurrency']);
// Runs with rate limits on in the accept phase, each followed by one without.
const LIMIT_PAIRS = 2;
const STREAMS = Number(args['concurrent-streams']);
const MANY = Number(args.many);
const STREAM_SECONDS = Number(args['stream-seconds']);
const LONG: LongShape = { streams: Number(args.streams), frames: Number(args.frames), frameMs: Number(args['frame-ms']), arrivalMs: Number(args['arrival-s']) * 1000 };
const SARSEN_PROCESSES = Number(args['sarsen-processes']);
const PROCESSES_C = 64;
const PHASES = new Set(args.phases.split(','));
for (const p of PHASES) if (!PHASE_NAMES.includes(p)) throw new Error(`unknown phase ${p}; the phases are ${PHASE_NAMES.join(', ')}`);
if (![SECONDS, WARMUP, ROUNDS, ACCEPT_C, STREAMS, MANY, STREAM_SECONDS, LONG.streams, LONG.frames, LONG.frameMs, ...LEVELS].every((n) => Number.isInteger(n) && n >= 0) || SECONDS < 1 || ROUNDS < 1 || LONG.frames < 2 || !(LONG.arrivalMs > 0) || !(SARSEN_PROCESSES >= 1)) {
  throw new Error('usage: --seconds N --warmup N --concurrency 1,16,64 --rounds N (≥ 1) --concurrent-streams N --many N --stream-seconds N --streams N --frames N (≥ 2) --frame-ms N --arrival-s S --sarsen-processes N');
}
const CHILD_ENV: Record<string, string> = childEnv(args['child-env']);
const spans: SpanCollector | null = args.trace ? await startSpanCollector() : null;
if (spans) Object.assign(CHILD_ENV, spans.env);
const traceWindows: TraceWindow[] = [];
const epochNow = () => performance.timeOrigin + performance.now();
const describeRuntime = (env: Record<string, string>) => Object.entries(env).map(([k, v]) => `${k}=${v}`).join(' ');
const FRAMES = 50;
const PACE_MS = 20;
const DRAIN_LIMIT_MS = 180_000;

const out = (line = '') => process.stdout.write(line + '\n');
const progress = (line: string) => process.stderr.write(`[bench:compare] ${line}\n`);
const HERE = path.dirname(fileURLToPath(import.meta.url));
const TAG = crypto.randomBytes(4).toString('hex'); // bodies distinct across runs, too

type Side = { name: 'direct' | 'gateway' | 'relay' | 'durable relay' | 'sarsen'; url: string; headers: Record<string, string>; pid: number };
/**
 * A wrk run with the CPU each part used over it, in cores: the side's processes, PostgreSQL, the
 * fake provider, and the whole machine (busy, and stolen by the hypervisor).
 */
type Measured = WrkResult & { cpu: number; pgCpu: number; providerCpu: number; machineCpu: number; stealCpu: number };

const chatBody = (stream: boolean) => `{"model":"gpt-bench",${stream ? '"stream":true,' : ''}"messages":[{"role":"user","content":"compare ${TAG} {n}"}]}`;

type Provider = { url: string; child: SarsenChild };

async function startProvider(frames = FRAMES, paceMs = PACE_MS, record = false): Promise<Provider> {
  const child = spawnNode(path.join(HERE, 'lib/provider-process.ts'), ['--frames', String(frames), '--pace', String(paceMs), ...(record ? ['--record'] : [])], process.env, 'bench provider');
  const [, url] = await child.waitFor(/listening (http:\S+)/, 30_000);
  return { url: url!, child };
}

/**
 * A bare Node relay to the provider, storing nothing: the floor of a Node proxy's cost; with a
 * database, durable: each body and answer a one-row commit (lib/relay-process.ts).
 */
async function startRelay(providerUrl: string, database?: TestDatabase): Promise<Provider> {
  const stores = database ? ['--database', JSON.stringify(database.conn)] : [];
  const child = spawnNode(path.join(HERE, 'lib/relay-process.ts'), ['--to', providerUrl, ...stores], process.env, 'bench relay');
  const [, url] = await child.waitFor(/listening (http:\S+)/, 30_000);
  return { url: url!, child };
}

/** `limited`: a key whose rate limits are checked on every submission but never reached; `cached`: a namespace with the response cache. */
type SarsenUnderTest = { sarsen: BenchSarsen; pool: pg.Pool; side: Side; limited: Side; cached: Side; postmaster: number | null };

// Limits far above any rate this machine reaches: every submission pays for the check, none is refused.
const NEVER_REACHED = { requests_per_minute: 2_000_000_000, tokens_per_minute: 1_000_000_000_000 };

/** A Sarsen child (role both) on a fresh database, provisioned with keys on the provider. */
async function startSarsen(providerUrl: string, processes = SARSEN_PROCESSES): Promise<SarsenUnderTest> {
  const sarsen = await startBenchSarsen({ settings: { shutdown_grace_ms: 5_000 }, env: CHILD_ENV, processes, args: args['sarsen-arg'] });
  const pool = createPool(sarsen.db.conn, { max: 2, name: 'sarsen-bench' });
  const sideOf = async (opts: Parameters<typeof provisionChat>[3] = {}): Promise<Side> => {
    const tenant = await provisionChat(sarsen.url, pool, providerUrl, opts);
    return {
      name: 'sarsen',
      url: `${sarsen.url}${tenant.basePath}/chat/completions`,
      headers: { 'content-type': 'application/json', 'x-sarsen-key': tenant.key },
      pid: sarsen.child.child.pid!,
    };
  };
  const [side, limited, cached] = [await sideOf(), await sideOf({ limits: NEVER_REACHED }), await sideOf({ cacheTtlMinutes: 60 })];
  return { sarsen, pool, side, limited, cached, postmaster: await postmasterPid(pool).catch(() => null) };
}

async function stopSarsen(s: SarsenUnderTest | null): Promise<void> {
  if (!s) return;
  await s.pool.end().catch(() => undefined);
  await s.sarsen.stop().catch((err) => progress(`stopping Sarsen failed: ${err}`));
}

async function main(): Promise<void> {
  const db = await benchDatabase({ allowNonDurable: args['allow-non-durable'] });
  const has = (...phases: string[]) => phases.some((p) => PHASES.has(p));
  // The cache and many phases need neither wrk nor the gateway.
  const wrk = has('nonstream', 'accept', 'streams', 'processes') ? wrkVersion() : 'none (not needed by these phases)';
  if (!wrk) throw new Error('wrk is not installed (Debian: apt-get install wrk); the side-by-side benchmark uses it as its load generator.');
  let provider: Provider | null = null;
  let longProvider: Provider | null = null;
  const relays: Provider[] = [];
  let relayDatabase: TestDatabase | null = null;
  let gateway: Gateway | null = null;
  let under: SarsenUnderTest | null = null;
  let postmaster: number | null = null;
  // Each group of phases gets a Sarsen of its own, on a fresh database.
  const freshSarsen = async (what: string, providerUrl: string, processes = SARSEN_PROCESSES) => {
    await stopSarsen(under);
    under = null;
    progress(`starting Sarsen (role both, --processes ${processes}) against a fresh database for ${what}`);
    under = await startSarsen(providerUrl, processes);
    postmaster ??= under.postmaster;
    return under;
  };
  try {
    provider = await startProvider();
    if (has('nonstream', 'accept', 'streams', 'longstreams')) gateway = await startGateway();

    out(`Sarsen side-by-side benchmark — ${new Date().toISOString()}`);
    out(`machine: ${os.cpus().length} × ${os.cpus()[0]?.model ?? '?'}, ${Math.round(os.totalmem() / 2 ** 30)} GiB, load average ${os.loadavg().map((l) => fmt(l, 2)).join(' ')}`);
    out(`node ${process.version}; load generator ${wrk}; gateway ${gateway ? `@portkey-ai/gateway ${gateway.version}` : 'none (not needed by these phases)'}; provider: a Node process answering at once (streams: ${FRAMES} frames ${PACE_MS} ms apart)`);
    out(`database: ${db.describe}`);
    out(`commit: ${describeCommitLatency(await measureCommitLatency())}`);
    out(`Sarsen: role both, --processes ${SARSEN_PROCESSES} (the processes phase: 1 and 2)${args['sarsen-arg'].map((a) => ` ${a}`).join('')}, ${describeRuntime(CHILD_ENV)}; a fresh process for the request/response phases, another for the streaming ones, another for the long streams; ${SECONDS} s measured after ${WARMUP} s of warm-up per phase (non-streaming: ${ROUNDS} rounds of every side at every level); every body distinct`);
    out();

    const auth = { authorization: 'Bearer sk-bench-direct', 'content-type': 'application/json' };
    const providerPid = provider.child.child.pid!;
    const direct: Side = { name: 'direct', url: `${provider.url}/v1/chat/completions`, headers: auth, pid: providerPid };
    const viaGateway = gateway && ({ name: 'gateway', url: `${gateway.url}/v1/chat/completions`, headers: { ...auth, ...gateway.headers(provider.url) }, pid: gateway.pid } satisfies Side);
    // A relay to a provider (each phase has a provider of its own), called as the provider is.
    const relayTo = async (providerUrl: string, database?: TestDatabase): Promise<Side> => {
      const relay = await startRelay(providerUrl, database);
      relays.push(relay);
      return { ...direct, name: database ? 'durable relay' : 'relay', url: `${relay.url}/v1/chat/completions`, pid: relay.child.child.pid! };
    };

    const measure = async (side: Side, c: number, body: string, seconds: number, warmup: number, url = side.url): Promise<Measured> => {
      const load = { url, headers: side.headers, body, connections: c, timeoutS: 10 };
      if (warmup > 0) await runWrk({ ...load, durationS: warmup });
      const cpu0 = treeCpuMs(side.pid);
      const pg0 = serverCpuMs(postmaster);
      const provider0 = treeCpuMs(providerPid);
      const machine0 = machineCpuMs();
      const t0 = performance.now();
      const from = epochNow();
      const r = await runWrk({ ...load, durationS: seconds });
      const wall = performance.now() - t0;
      if (side.name === 'sarsen') traceWindows.push({ what: `c=${c}${url === side.url ? '' : ` ${new URL(url).pathname.split('/').pop()}`}`, from, to: epochNow() });
      const machine = machineCpuMs();
      return {
        ...r, cpu: (treeCpuMs(side.pid) - cpu0) / wall, pgCpu: (serverCpuMs(postmaster) - pg0) / wall,
        providerCpu: (treeCpuMs(providerPid) - provider0) / wall,
        machineCpu: (machine.busy - machine0.busy) / wall, stealCpu: (machine.steal - machine0.steal) / wall,
      };
    };

    // Non-streaming, closed loop: rounds of every side at every level.
    const nonStream = new Map<number, Map<string, Measured>[]>(LEVELS.map((c) => [c, []]));
    // Each c=1 round's durable commit, measured just before its sides: the floor's two commits.
    const commitAtC1: number[] = [];
    let acceptance: Report['acceptance'] = null;
    let cache: CacheLatency | null = null;
    if (has('nonstream', 'accept', 'cache')) {
      const s = await freshSarsen('the request/response phases', provider.url);
      const viaRelay = PHASES.has('nonstream') ? await relayTo(provider.url) : null;
      // The durable relay's records go to a database of their own on the benchmark's server.
      relayDatabase = LEVELS.includes(1) && PHASES.has('nonstream') ? await createTestDatabase() : null;
      const viaDurableRelay = relayDatabase && (await relayTo(provider.url, relayDatabase));
      for (let round = 1; round <= (PHASES.has('nonstream') ? ROUNDS : 0); round++) {
        for (const c of LEVELS) {
          const row = new Map<string, Measured>();
          if (c === 1) {
            progress(`non-streaming c=1, round ${round} of ${ROUNDS}: the commit probe`);
            commitAtC1.push(await measureCommitNow(1));
          }
          for (const side of [direct, viaGateway!, viaRelay!, ...(c === 1 && viaDurableRelay ? [viaDurableRelay] : []), s.side]) {
            progress(`non-streaming c=${c}, round ${round} of ${ROUNDS}: ${side.name}`);
            row.set(side.name, await measure(side, c, chatBody(false), SECONDS, WARMUP));
          }
          nonStream.get(c)!.push(row);
        }
      }

      // Fire-and-forget acceptance, then the backlog drained.
      if (PHASES.has('accept')) {
        // The gateway's round of median throughput at that level, if it was measured.
        let gateway = middle((nonStream.get(ACCEPT_C) ?? []).map((row) => row.get('gateway')!), (m) => m.rate);
        if (!gateway) {
          progress(`non-streaming c=${ACCEPT_C}: gateway (the acceptance target's comparator)`);
          gateway = await measure(viaGateway!, ACCEPT_C, chatBody(false), SECONDS, WARMUP);
        }
        const accept = async (side: Side, what: string, seconds = SECONDS) => {
          progress(`POST /requests at c=${ACCEPT_C}${what}`);
          const acceptStart = await dbNow(s.pool);
          const accepted = await measure(side, ACCEPT_C, chatBody(false), seconds, 0, side.url.replace(/\/chat\/completions$/, '/requests'));
          const drain = await drained(s.pool, acceptStart);
          progress(`accepted ${fmt(accepted.rate, 0)}/s; backlog ${drain.backlog} drained in ${fmt(drain.ms / 1000, 1)} s`);
          return { accepted, drain };
        };
        // The route warmed (and its backlog drained) first, as every other phase is: a cold
        // first run is slower than the runs after it.
        if (WARMUP > 0) await accept(s.side, ', warming up', WARMUP);
        const { accepted, drain } = await accept(s.side, '');
        // Limits on and off in turn, off first and last: a drift over the runs (a warming
        // process, a growing table) weighs on both sides alike.
        const limitsOn: Measured[] = [];
        const limitsOff: Measured[] = [accepted];
        for (let i = 0; i < LIMIT_PAIRS; i++) {
          limitsOn.push((await accept(s.limited, ', a key with rate limits')).accepted);
          limitsOff.push((await accept(s.side, ', no limits again')).accepted);
        }
        acceptance = { accepted, drain, gateway, limitsOn, limitsOff };
      }

      // The response cache: what a hit adds, against what a provider call adds.
      if (PHASES.has('cache')) {
        progress('response cache at c=1: provider calls and cache hits');
        const from = epochNow();
        cache = await cacheLatency(direct, s.cached, SECONDS);
        traceWindows.push({ what: 'cache', from, to: epochNow() });
      }
    }

    // Streams, through a fresh Sarsen process.
    const streams = new Map<string, Measured>();
    const many = new Map<string, Burst>();
    if (has('streams', 'many')) {
      const s = await freshSarsen('the streaming phases', provider.url);
      for (const side of PHASES.has('streams') ? [direct, viaGateway!, s.side] : []) {
        progress(`${STREAMS} concurrent streams: ${side.name}`);
        streams.set(side.name, await measure(side, STREAMS, chatBody(true), STREAM_SECONDS, 2));
      }
      for (const side of PHASES.has('many') ? [direct, s.side] : []) {
        progress(`${MANY} streams opened at once: ${side.name}`);
        many.set(side.name, await burst(side, MANY));
      }
    }

    // Long streams, from a provider that records its writes, through a fresh Sarsen process.
    const long: LongResult[] = [];
    if (PHASES.has('longstreams')) {
      longProvider = await startProvider(LONG.frames, LONG.frameMs, true);
      const viaRelay = await relayTo(longProvider.url);
      const s = await freshSarsen('the long streams', longProvider.url);
      const sides: LongSide[] = [
        { ...direct, url: `${longProvider.url}/v1/chat/completions`, pid: longProvider.child.child.pid! },
        { ...viaGateway!, headers: { ...auth, ...gateway!.headers(longProvider.url) } },
        viaRelay,
        s.side,
      ];
      for (const side of sides) {
        progress(`${LONG.streams} long streams: ${side.name}`);
        if (side === s.side) traceWindows.push({ what: 'long streams', from: epochNow(), to: Infinity });
        long.push(await runLongStreams(side, longProvider.url, LONG, { postmaster, ...(side === s.side ? { db: s.pool } : {}), progress }));
      }
    }

    // One process against two, each fresh.
    const processes = new Map<number, Measured>();
    for (const n of PHASES.has('processes') ? [1, 2] : []) {
      const s = await freshSarsen(`--processes ${n}`, provider.url, n);
      progress(`non-streaming c=${PROCESSES_C}: Sarsen --processes ${n}`);
      processes.set(n, await measure(s.side, PROCESSES_C, chatBody(false), SECONDS, WARMUP));
    }

    report({ nonStream, commitAtC1, acceptance, cache, streams, many, long, processes });
  } finally {
    progress('cleaning up');
    await stopSarsen(under);
    // A stopping process exports what it still held: the last phase's spans are in once it is gone.
    if (spans) {
      out();
      out(spans.report(traceWindows));
    }
    await gateway?.stop().catch(() => undefined);
    await provider?.child.kill('SIGTERM');
    await longProvider?.child.kill('SIGTERM');
    for (const relay of relays) await relay.child.kill('SIGTERM');
    await relayDatabase?.drop().catch(() => undefined);
    await shutdownDatabases();
    await spans?.close();
  }
}

type CacheLatency = { pairs: number; direct: ReturnType<typeof summarise>; call: ReturnType<typeof summarise>; hit: ReturnType<typeof summarise>; misses: number; overOneSecond: number };

/** One POST on a kept-alive connection: its latency in ms and whether the cache answered it. */
function timedPost(agent: http.Agent, url: string, headers: Record<string, string>, body: string): Promise<{ ms: number; cached: boolean; status: number }> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const req = http.request(url, { method: 'POST', agent, headers: { ...headers, 'content-length': String(Buffer.byteLength(body)) } }, (res) => {
      res.resume();
      res.on('end', () => resolve({ ms: performance.now() - t0, cached: res.headers['x-sarsen-cached-from'] !== undefined, status: res.statusCode! }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

/**
 * For `seconds`, one at a time: a distinct body directly at the provider, the same body through
 * Sarsen with the cache on (a provider call), and once more (a cache hit). The hit's latency
 * against the call's says what answering from storage costs.
 */
async function cacheLatency(direct: Side, cached: Side, seconds: number): Promise<CacheLatency> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const lat = { direct: [] as number[], call: [] as number[], hit: [] as number[] };
  let misses = 0;
  try {
    const until = performance.now() + seconds * 1000;
    for (let i = 0; performance.now() < until; i++) {
      const body = chatBody(false).replace('{n}', `cache-${crypto.randomBytes(4).toString('hex')}-${i}`);
      lat.direct.push((await timedPost(agent, direct.url, direct.headers, body)).ms);
      const call = await timedPost(agent, cached.url, cached.headers, body);
      const hit = await timedPost(agent, cached.url, cached.headers, body);
      if (call.status !== 200 || hit.status !== 200 || call.cached || !hit.cached) misses++;
      lat.call.push(call.ms);
      lat.hit.push(hit.ms);
    }
  } finally {
    agent.destroy();
  }
  const overOneSecond = [...lat.call, ...lat.hit].filter((ms) => ms > 1000).length;
  return { pairs: lat.hit.length, direct: summarise(lat.direct), call: summarise(lat.call), hit: summarise(lat.hit), misses, overOneSecond };
}

type Burst = { completed: number; failures: string; p50Ms: number; p99Ms: number; maxMs: number; wallMs: number; peakRssMb: number };

/** `n` streams opened at the same moment, each once (not a closed loop): do they all complete, and in how long. */
async function burst(side: Side, n: number): Promise<Burst> {
  const agent = createAgent();
  const rss = sampleTreeRss(side.pid, 50);
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
  /** By concurrency, each round's runs by side. */
  nonStream: Map<number, Map<string, Measured>[]>;
  /** Each c=1 round's durable one-row commit p50, in ms. */
  commitAtC1: number[];
  acceptance: {
    accepted: Measured; gateway: Measured; drain: { backlog: number; ms: number; executions: number; rate: number };
    /** Runs with a limited key, each between two runs without (`limitsOff`, the first being `accepted`). */
    limitsOn: Measured[]; limitsOff: Measured[];
  } | null;
  cache: CacheLatency | null;
  streams: Map<string, Measured>;
  many: Map<string, Burst>;
  long: LongResult[];
  processes: Map<number, Measured>;
};

function report(r: Report): void {
  const cores = (m: Measured) => `${fmt(m.cpu, 2)} / ${fmt(m.pgCpu, 2)}`;
  const failed = (m: Measured | undefined) => (m ? m.non2xx + m.errors.connect + m.errors.read + m.errors.write + m.errors.timeout : NaN);
  const slowest = (m: Measured) => `max ${fmt(m.maxMs, 0)} ms${m.errors.timeout > 0 ? ` (and ${m.errors.timeout} timeouts over 10 s)` : ''}, ${m.overOneSecond} over 1 s`;
  const targets: string[][] = [];
  // Sarsen's non-stream runs, for "no request over 1 s".
  const sarsenRuns: { what: string; maxMs: number; over: number }[] = [];
  const noteRun = (what: string, m: Measured) => sarsenRuns.push({ what, maxMs: m.errors.timeout > 0 ? Infinity : m.maxMs, over: m.overOneSecond });

  if (PHASES.has('nonstream')) {
    out(`Non-streaming, closed loop, provider answering at once, ${ROUNDS} rounds of every side at every level (latency in ms; CPU in cores: the side's process / PostgreSQL; relay: a bare Node relay that stores nothing, the least a Node proxy spends; durable relay, at c=1: the relay with a one-row commit before the provider call and one before the answer)`);
    const rows: string[][] = [];
    for (const [c, rounds] of r.nonStream) {
      rounds.forEach((row, i) => {
        const direct = row.get('direct')!;
        for (const [name, m] of row) {
          rows.push([
            String(c), String(i + 1), name, fmt(m.rate, 0), name === 'direct' ? '' : fmt(m.rate / row.get('gateway')!.rate, 2),
            fmt(m.p50Ms, 2), fmt(m.p90Ms, 2), fmt(m.p99Ms, 2), name === 'direct' ? '' : fmt(m.p50Ms - direct.p50Ms, 2),
            name === 'direct' ? '' : fmt(m.p99Ms - direct.p99Ms, 2), fmt(m.maxMs, 0), String(m.overOneSecond), describeFailures(m), cores(m),
          ]);
          if (name === 'sarsen') noteRun(`c=${c}, round ${i + 1}`, m);
        }
      });
    }
    out(table(['c', 'round', 'side', 'req/s', '× gateway', 'p50', 'p90', 'p99', '+p50', '+p99', 'max', '> 1 s', 'failures', 'CPU'], rows));
    out();
    // Each round's own figure at a level; the target is judged by their median.
    const judged = (what: string, c: number, figure: (row: Map<string, Measured>) => number, target: number, better: 'higher' | 'lower', unit: string) => {
      const xs = (r.nonStream.get(c) ?? []).map(figure);
      const m = median(xs);
      targets.push([`${what}${xs.length > 1 ? ` (median of ${xs.map((x) => fmt(x, 2)).join(', ')})` : ''}`, `${better === 'higher' ? '≥' : '≤'} ${unit === 'ms' ? `${target} ms` : fmt(target, 1)}`, fmt(m, 2), verdict(m, target, better, unit)]);
    };
    const ratio = (row: Map<string, Measured>) => row.get('sarsen')!.rate / row.get('gateway')!.rate;
    // Nothing completed: MISSED, not a negative figure.
    const added = (row: Map<string, Measured>) => (row.get('sarsen')!.requests === 0 ? Infinity : row.get('sarsen')!.p50Ms - row.get('direct')!.p50Ms);
    judged('non-stream req/s at c=64, × the gateway', 64, ratio, 1.3, 'higher', '×');
    judged('non-stream req/s at c=16, × the gateway', 16, ratio, 1, 'higher', '×');
    // The floor at c=1: what the gateway adds, plus the two durable commits a request needs
    // (this round's commit probe), plus 0.5 ms; the margin is the floor less what Sarsen adds.
    const c1 = r.nonStream.get(1) ?? [];
    if (c1.length > 0 && r.commitAtC1.length === c1.length) {
      const rows = c1.map((row, i) => {
        const gatewayAdded = row.get('gateway')!.p50Ms - row.get('direct')!.p50Ms;
        const floor = gatewayAdded + 2 * r.commitAtC1[i]! + 0.5;
        const durable = row.get('durable relay');
        return { gatewayAdded, commit: r.commitAtC1[i]!, floor, margin: floor - added(row), durableAdded: durable ? durable.p50Ms - row.get('direct')!.p50Ms : NaN };
      });
      out('The floor at c=1, by round: the gateway\'s added p50 + 2 × a durable one-row commit (measured just before the round) + 0.5 ms; margin = floor − Sarsen\'s added p50;');
      out('beside them what the durable relay adds: a bare relay with a one-row commit before the provider call and another before the answer, the two commits as a Node proxy pays them');
      out(table(['round', 'gateway +p50', 'commit p50', 'floor', 'durable relay +p50', 'Sarsen +p50', 'margin'],
        rows.map((x, i) => [String(i + 1), fmt(x.gatewayAdded, 2), fmt(x.commit, 2), fmt(x.floor, 2), fmt(x.durableAdded, 2), fmt(x.floor - x.margin, 2), fmt(x.margin, 2)])));
      out();
      const over = median(rows.map((x) => -x.margin));
      targets.push([`added p50 at c=1 beyond the floor (median of ${rows.map((x) => fmt(-x.margin, 2)).join(', ')})`, '≤ 0 ms', fmt(over, 2), verdict(over, 0, 'lower', 'ms')]);
    }
  }

  if (r.acceptance) {
    const { accepted: a, drain, gateway } = r.acceptance;
    out(`POST /requests (fire-and-forget) at c=${a.connections}: ${fmt(a.rate, 0)} accepted/s (p50 ${fmt(a.p50Ms, 2)} ms, p99 ${fmt(a.p99Ms, 2)} ms, failures: ${describeFailures(a)}, CPU ${cores(a)}); the gateway at c=${ACCEPT_C}: ${fmt(gateway.rate, 0)} req/s`);
    out(drain.backlog >= 0
      ? `  backlog when the window closed: ${drain.backlog}; drained ${fmt(drain.ms / 1000, 1)} s later; ${drain.executions} executions completed (${fmt(drain.rate, 0)}/s from window start to drain)`
      : `  backlog of ${-drain.backlog} NOT drained within ${DRAIN_LIMIT_MS / 1000} s`);
    out();
    const { limitsOn, limitsOff } = r.acceptance;
    const mean = (ms: Measured[]) => ms.reduce((sum, m) => sum + m.rate, 0) / ms.length;
    const ratio = mean(limitsOn) / mean(limitsOff);
    const rates = (ms: Measured[]) => ms.map((m) => fmt(m.rate, 0)).join(', ');
    noteRun('POST /requests', a);
    limitsOff.forEach((m, i) => { if (i > 0) noteRun(`POST /requests, without limits again (${i})`, m); });
    limitsOn.forEach((m, i) => noteRun(`POST /requests, rate limits on (${i + 1})`, m));
    out(`  slowest acceptances without limits: ${limitsOff.map(slowest).join('; ')}; with limits on: ${limitsOn.map(slowest).join('; ')}`);
    out(`  with rate limits on (a key whose limits are checked, never reached), ${limitsOn.length} runs between ${limitsOff.length} without: ${rates(limitsOn)} accepted/s (CPU ${limitsOn.map(cores).join(', ')}); without: ${rates(limitsOff)} accepted/s`);
    out();
    targets.push(
      [`POST /requests acceptance, × the gateway at c=${ACCEPT_C}`, '≥ 1.5', fmt(a.rate / gateway.rate, 2), verdict(a.rate / gateway.rate, 1.5, 'higher', '×')],
      ['  and its backlog drained', 'yes', drain.backlog >= 0 ? 'yes' : 'no', drain.backlog >= 0 ? 'met' : 'MISSED'],
      [`  with rate limits on, × without (means of the runs in turn)`, '≥ 0.95', fmt(ratio, 3), verdict(ratio, 0.95, 'higher', '×')],
    );
  }

  if (r.cache) {
    const c = r.cache;
    out(`Response cache at c=1, ${c.pairs} distinct bodies each sent directly, then twice through Sarsen (latency in ms; added = through Sarsen − direct)`);
    out(table(
      ['answer', 'p50', 'p90', 'p99', 'added p50', 'added p99'],
      [
        ['direct at the provider', fmt(c.direct.p50, 2), fmt(c.direct.p90, 2), fmt(c.direct.p99, 2), '', ''],
        ['Sarsen, provider call', fmt(c.call.p50, 2), fmt(c.call.p90, 2), fmt(c.call.p99, 2), fmt(c.call.p50 - c.direct.p50, 2), fmt(c.call.p99 - c.direct.p99, 2)],
        ['Sarsen, cache hit', fmt(c.hit.p50, 2), fmt(c.hit.p90, 2), fmt(c.hit.p99, 2), fmt(c.hit.p50 - c.direct.p50, 2), fmt(c.hit.p99 - c.direct.p99, 2)],
      ],
    ));
    out(`  a cache hit takes ${fmt(c.hit.p50, 2)} ms p50 against a provider call's ${fmt(c.call.p50, 2)} ms through Sarsen; pairs not answered as expected (call, then hit): ${c.misses}`);
    out(`  slowest through Sarsen: max ${fmt(Math.max(c.call.max, c.hit.max), 0)} ms, ${c.overOneSecond} over 1 s`);
    sarsenRuns.push({ what: 'cache', maxMs: Math.max(c.call.max, c.hit.max), over: c.overOneSecond });
    out();
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
    out(`${MANY} streams opened at once, each once (duration in ms; RSS of the side's processes)`);
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

  if (PHASES.has('longstreams')) {
    out();
    const long = longStreamsReport(r.long, LONG);
    out(long.text);
    targets.push(...long.targets);
  }

  if (PHASES.has('processes')) {
    out();
    out(`Sarsen with --processes 1 and 2, non-streaming at c=${PROCESSES_C} (latency in ms; CPU in cores of the machine's ${os.cpus().length}: Sarsen's processes, PostgreSQL, the fake provider, the rest (wrk and whatever else runs), the machine's busy total, and the time the hypervisor gave to other guests)`);
    out(table(
      ['processes', 'req/s', 'p50', 'p99', 'max', 'failures', 'Sarsen', 'PostgreSQL', 'provider', 'rest', 'busy', 'stolen'],
      [...r.processes].map(([n, m]) => [
        String(n), fmt(m.rate, 0), fmt(m.p50Ms, 2), fmt(m.p99Ms, 2), fmt(m.maxMs, 0), describeFailures(m),
        fmt(m.cpu, 2), fmt(m.pgCpu, 2), fmt(m.providerCpu, 2), fmt(m.machineCpu - m.cpu - m.pgCpu - m.providerCpu, 2), fmt(m.machineCpu, 2), fmt(m.stealCpu, 2),
      ]),
    ));
    for (const [n, m] of r.processes) noteRun(`--processes ${n}`, m);
    const ratio = (r.processes.get(2)?.rate ?? NaN) / (r.processes.get(1)?.rate ?? NaN);
    // The default runs one process where PostgreSQL shares the machine (docs/operations.md "Processes"): this says whether a second would pay here.
    targets.push([`--processes 2, × --processes 1 at c=${PROCESSES_C}`, 'none', fmt(ratio, 2), ratio > 1 ? 'a second process pays here' : 'one process serves more here']);
  }

  if (sarsenRuns.length > 0) {
    const over = sarsenRuns.reduce((sum, x) => sum + x.over, 0);
    const worst = sarsenRuns.reduce((a, b) => (b.maxMs > a.maxMs ? b : a));
    targets.push([
      'non-stream requests through Sarsen over 1 s, every run',
      '0',
      `${over} (slowest ${Number.isFinite(worst.maxMs) ? `${fmt(worst.maxMs, 0)} ms` : 'over 10 s'}, ${worst.what})`,
      over === 0 ? 'met' : 'MISSED',
    ]);
  }
  out();
  out('Targets (docs/performance.md "Targets")');
  out(table(['measure', 'target', 'measured', 'verdict'], targets));
}

/** The element whose `key` is the median of theirs (the lower of the middle two for an even count). */
function middle<T>(xs: readonly T[], key: (x: T) => number): T | undefined {
  return [...xs].sort((a, b) => key(a) - key(b))[Math.floor((xs.length - 1) / 2)];
}

/** The capacity benchmark in a process of its own (it pins itself to CPUs), once this one's children are gone. */
function capacity(): void {
  const passed = [
    ...(args['allow-non-durable'] ? ['--allow-non-durable'] : []),
    ...args['sarsen-arg'].map((a) => `--sarsen-arg=${a}`),
    ...args['child-env'].map((kv) => `--child-env=${kv}`),
    ...args['capacity-arg'],
  ];
  progress(`the capacity phase: bench/capacity.ts ${passed.join(' ')}`);
  out();
  const run = spawnSync(process.execPath, [path.join(HERE, 'capacity.ts'), ...passed], { stdio: 'inherit' });
  if (run.status !== 0) throw new Error(`bench/capacity.ts failed (${run.signal ?? `exit ${run.status}`})`);
}

if ([...PHASES].some((p) => p !== 'capacity')) await main();
if (PHASES.has('capacity')) capacity();
