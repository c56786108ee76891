// The capacity benchmark (docs/performance.md): how much traffic one core carries, durably.
// The load (the fake provider, wrk, the stream callers: this process) runs on --load-cpus, the
// proxy under test on --proxy-cpus; for Sarsen its PostgreSQL shares the proxy's cores, because
// durability is part of its cost. The PostgreSQL is the benchmark's own (lib/owned-postgres.ts:
// embedded, durable, pinned from its start), so its whole CPU is Sarsen's database's and no
// shared server's affinity is touched. Portkey's open-source gateway (stateless) is the
// reference, measured in the same run; every ratio is against it.
//
//   requests   non-streaming closed loop at --concurrency (default 16,64) through each proxy:
//              req/s while pinned, and requests per CPU-second the proxy used (Sarsen: its
//              processes and PostgreSQL's), CPU per request split by process, and Sarsen's
//              database rows, commits, statements and WAL bytes per request. --rounds (3)
//              rounds, each measuring the gateway then Sarsen at every level, both running
//              throughout: the ratio judged is the median of the rounds' own, so that drift on
//              a shared machine (single runs move it by half and more) weighs on both sides alike
//   streams    streams of --frames (300) frames --frame-ms (30) apart, --arrival-s (2) to open
//              them all, at each count of --streams in turn, directly and through each proxy:
//              a proxy's streams per core is the largest count whose p50 duration stays within
//              --within (1.05) × the direct run's at that count, every stream byte-exact; a
//              proxy stops at its first count that misses. CPU per 1,000 frames split by
//              process, peak RSS, and Sarsen's database cost per frame.
//
// Sarsen is started as a user starts it (no --processes: its default), with what compare.ts
// gives its children (--port 0 --host 127.0.0.1, the runtime settings; --sarsen-arg, --child-env).
// Run: npm run bench:capacity [-- --seconds 8 --streams 100,200,400 --parts requests,streams --load-cpus 0 --proxy-cpus 1]
// Needs Linux, taskset (util-linux) and wrk, and two CPUs this process may use.
import os from 'node:os';
import path from 'node:path';
import crypto from 'node:crypto';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import { shutdownDatabases } from '../test/support/db.ts';
import { spawnNode, type SarsenChild } from '../test/support/child.ts';
import { createPool } from '../src/db/pool.ts';
import { configureLogging } from '../src/log.ts';
import { benchDatabase } from './lib/database.ts';
import { startGateway, type Gateway } from './lib/gateway.ts';
import { startBenchSarsen, type BenchSarsen, childEnv } from './lib/sarsen-child.ts';
import { provisionChat } from './lib/provision.ts';
import { runWrk, wrkVersion, describeFailures, type WrkResult } from './lib/wrk.ts';
import { serverCpuMs } from './lib/cpu.ts';
import { treeCpuMs, processTree } from './lib/process-tree.ts';
import { runLongStreams, type LongResult, type LongShape, type LongSide } from './lib/long-streams.ts';
import { allowedCpus, assertPinned, cpusBusyMs, hasTaskset, parseCpuList, pin, pinTree } from './lib/pin.ts';
import { startOwnedPostgres, type OwnedPostgres } from './lib/owned-postgres.ts';
import { settledDbCost, costBetween, statementCounts, busiestStatements, type DbCost, type StatementCounts } from './lib/db-cost.ts';
import { fmt, median, table, verdict } from './lib/stats.ts';
import { benchArgs } from './lib/args.ts';

const PART_NAMES = ['requests', 'streams'];
const args = benchArgs({
  seconds: { type: 'string', default: '8' },
  warmup: { type: 'string', default: '2' },
  concurrency: { type: 'string', default: '16,64' },
  rounds: { type: 'string', default: '3' },
  // The counts of concurrent streams tried in turn; each proxy stops at its first miss.
  streams: { type: 'string', default: '100,200,300,400,600,800,1000,1300,1600,2000' },
  frames: { type: 'string', default: '300' },
  'frame-ms': { type: 'string', default: '30' },
  'arrival-s': { type: 'string', default: '2' },
  within: { type: 'string', default: '1.05' },
  'load-cpus': { type: 'string', default: '0' },
  'proxy-cpus': { type: 'string', default: '1' },
  parts: { type: 'string', default: PART_NAMES.join(',') },
  'allow-non-durable': { type: 'boolean', default: false },
  'child-env': { type: 'string', multiple: true, default: [] },
  'sarsen-arg': { type: 'string', multiple: true, default: [] },
});
const SECONDS = Number(args.seconds);
const WARMUP = Number(args.warmup);
const LEVELS = args.concurrency.split(',').map(Number);
const ROUNDS = Number(args.rounds);
const LADDER = args.streams.split(',').map(Number);
const FRAMES = Number(args.frames);
const FRAME_MS = Number(args['frame-ms']);
const ARRIVAL_MS = Number(args['arrival-s']) * 1000;
const WITHIN = Number(args.within);
const LOAD_CPUS = args['load-cpus'];
const PROXY_CPUS = args['proxy-cpus'];

/** Starts watching both sets of CPUs; the answer says how busy each was since. */
function watchCpus(): () => Busy {
  const [load, proxy] = [parseCpuList(LOAD_CPUS), parseCpuList(PROXY_CPUS)];
  const [load0, proxy0, t0] = [cpusBusyMs(load), cpusBusyMs(proxy), performance.now()];
  return () => {
    const wall = performance.now() - t0;
    return { load: (cpusBusyMs(load) - load0) / wall / load.length, proxy: (cpusBusyMs(proxy) - proxy0) / wall / proxy.length };
  };
}
const PARTS = new Set(args.parts.split(','));
for (const p of PARTS) if (!PART_NAMES.includes(p)) throw new Error(`unknown part ${p}; the parts are ${PART_NAMES.join(', ')}`);
if (![SECONDS, WARMUP, ROUNDS, FRAMES, FRAME_MS, ...LEVELS, ...LADDER].every((n) => Number.isInteger(n) && n >= 0) || SECONDS < 1 || ROUNDS < 1 || FRAMES < 2 || !(ARRIVAL_MS > 0) || !(WITHIN >= 1) || LADDER.some((n) => n < 1)) {
  throw new Error('usage: --seconds N (≥ 1) --warmup N --concurrency 16,64 --rounds N (≥ 1) --streams 100,200,... --frames N (≥ 2) --frame-ms N --arrival-s S --within X (≥ 1)');
}
const CHILD_ENV: Record<string, string> = childEnv(args['child-env']);

const out = (line = '') => process.stdout.write(line + '\n');
const progress = (line: string) => process.stderr.write(`[bench:capacity] ${line}\n`);
const HERE = path.dirname(fileURLToPath(import.meta.url));
const TAG = crypto.randomBytes(4).toString('hex');
const chatBody = `{"model":"gpt-bench","messages":[{"role":"user","content":"capacity ${TAG} {n}"}]}`;

type Side = LongSide & { name: 'direct' | 'gateway' | 'sarsen' };
/** A pinned wrk run and the CPU the proxy's processes and (for Sarsen) PostgreSQL used over it, in ms. */
type Measured = WrkResult & { wallMs: number; proxyMs: number; pgMs: number; busy: Busy; db: DbWork | null };
/** One round at one level: the gateway, then Sarsen. */
type Round = { round: number; c: number; gateway: Measured; sarsen: Measured };
/** How busy the load's CPUs and the proxy's were over a run, as a share of their time. */
type Busy = { load: number; proxy: number };
/** A count of streams through a side, against the direct run at that count. */
type Step = { n: number; run: LongResult; busy: Busy; direct: LongResult; ratio: number; passed: boolean; db: DbWork | null };
/** What Sarsen's database did over a run: totals, and its busiest statements per request or frame. */
type DbWork = { cost: DbCost; busiest: ReturnType<typeof busiestStatements> };
type DbMark = { cost: DbCost; statements: StatementCounts };

/** The CPU list checked against what this process may use; the two sets must not overlap. */
function checkCpus(): void {
  const mine = new Set(allowedCpus());
  const load = parseCpuList(LOAD_CPUS);
  const proxy = parseCpuList(PROXY_CPUS);
  for (const c of [...load, ...proxy]) if (!mine.has(c)) throw new Error(`CPU ${c} is not one this process may use (${[...mine].join(',')}); pick others with --load-cpus and --proxy-cpus`);
  if (load.some((c) => proxy.includes(c))) throw new Error('--load-cpus and --proxy-cpus overlap');
}

type SarsenUnderTest = { sarsen: BenchSarsen; side: Side; database: string };
/** How many processes Sarsen's default gave it (the last start's). */
let sarsenProcesses = NaN;

async function startSarsen(providerUrl: string): Promise<SarsenUnderTest> {
  const sarsen = await startBenchSarsen({ settings: { shutdown_grace_ms: 5_000 }, env: CHILD_ENV, processes: 'default', args: args['sarsen-arg'] });
  const pool = createPool(sarsen.db.conn, { max: 1, name: 'sarsen-capacity' });
  try {
    const tenant = await provisionChat(sarsen.url, pool, providerUrl);
    pinTree(sarsen.child.child.pid!, PROXY_CPUS);
    sarsenProcesses = processTree(sarsen.child.child.pid!).length;
    progress(`Sarsen runs ${sarsenProcesses} process(es)`);
    return {
      sarsen,
      database: sarsen.db.name,
      side: { name: 'sarsen', url: `${sarsen.url}${tenant.basePath}/chat/completions`, headers: { 'content-type': 'application/json', 'x-sarsen-key': tenant.key }, pid: sarsen.child.child.pid! },
    };
  } catch (err) {
    await sarsen.stop();
    throw err;
  } finally {
    await pool.end();
  }
}

async function main(): Promise<void> {
  const began = performance.now();
  if (process.platform !== 'linux' || !hasTaskset()) throw new Error('the capacity benchmark pins processes to CPUs: it needs Linux and taskset (util-linux)');
  const wrk = wrkVersion();
  if (!wrk) throw new Error('wrk is not installed (Debian: apt-get install wrk); the capacity benchmark uses it as its load generator.');
  checkCpus();
  configureLogging({ level: 'warn' }); // embedded PostgreSQL's start lines
  // This process, and so everything it starts from here on (the provider, wrk), runs on the
  // load's CPUs; the proxies and PostgreSQL are moved to the proxy's.
  pin([process.pid], LOAD_CPUS);

  let owned: OwnedPostgres | null = null;
  let stats: pg.Pool | null = null;
  let provider: SarsenChild | null = null;
  let gateway: Gateway | null = null;
  let under: SarsenUnderTest | null = null;
  const stopSarsen = async () => {
    await under?.sarsen.stop().catch((err) => progress(`stopping Sarsen failed: ${err}`));
    under = null;
  };
  try {
    progress('starting the benchmark\'s own PostgreSQL');
    owned = await startOwnedPostgres(PROXY_CPUS);
    const db = await benchDatabase({ allowNonDurable: args['allow-non-durable'] });
    stats = createPool({ ...owned.conn, database: 'postgres' }, { max: 1, name: 'capacity-stats' });
    provider = spawnNode(path.join(HERE, 'lib/provider-process.ts'), ['--frames', String(FRAMES), '--pace', String(FRAME_MS), '--record'], process.env, 'bench provider');
    const [, providerUrl] = await provider.waitFor(/listening (http:\S+)/, 30_000);
    gateway = await startGateway();
    pinTree(gateway.pid, PROXY_CPUS);

    out(`Sarsen capacity benchmark — ${new Date().toISOString()}`);
    out(`machine: ${os.cpus().length} × ${os.cpus()[0]?.model ?? '?'}, ${Math.round(os.totalmem() / 2 ** 30)} GiB, load average ${os.loadavg().map((l) => fmt(l, 2)).join(' ')}`);
    out(`pinned: the provider, wrk and the stream callers on CPU ${LOAD_CPUS}; the proxy under test on CPU ${PROXY_CPUS}, and for Sarsen its PostgreSQL too`);
    out(`node ${process.version}; load generator ${wrk}; gateway @portkey-ai/gateway ${gateway.version} (one process); provider: a Node process answering at once, streams of ${FRAMES} frames ${FRAME_MS} ms apart`);
    out(`database: the benchmark's own embedded PostgreSQL, pg_stat_statements loaded, ${db.describe}`);
    out(`Sarsen: as a user starts it (no --processes), --port 0 --host 127.0.0.1${args['sarsen-arg'].map((a) => ` ${a}`).join('')}, ${Object.entries(CHILD_ENV).map(([k, v]) => `${k}=${v}`).join(' ')}; a fresh process for each part; every body distinct`);
    out(`requests: c=${LEVELS.join(', ')}, ${ROUNDS} rounds of each side in turn, ${SECONDS} s measured after ${WARMUP} s of warm-up; streams: counts ${LADDER.join(', ')}, opened over ${ARRIVAL_MS / 1000} s, within ${WITHIN}× the direct run's p50 duration`);
    out();

    const direct: Side = { name: 'direct', url: `${providerUrl}/v1/chat/completions`, headers: { authorization: 'Bearer sk-bench-direct', 'content-type': 'application/json' }, pid: provider.child.pid! };
    const viaGateway: Side = { name: 'gateway', url: `${gateway.url}/v1/chat/completions`, headers: { ...direct.headers, ...gateway.headers(providerUrl!) }, pid: gateway.pid };
    const postmaster = owned.postmaster;
    const dbMark = async (database: string): Promise<DbMark> => ({ cost: await settledDbCost(stats!, database), statements: await statementCounts(stats!, database) });
    const dbWork = async (database: string, before: DbMark, n: number): Promise<DbWork> => {
      const after = await dbMark(database);
      return { cost: costBetween(before.cost, after.cost), busiest: busiestStatements(before.statements, after.statements, n) };
    };
    // Pinned again before each run (a replaced worker), and checked, with the load's side too.
    const pinSide = (side: Side) => {
      if (side.name !== 'direct') pinTree(side.pid, PROXY_CPUS);
      if (side.name === 'sarsen') owned!.pinAgain();
      assertPinned(side.pid, side.name === 'direct' ? LOAD_CPUS : PROXY_CPUS);
      if (side.name === 'sarsen') assertPinned(postmaster, PROXY_CPUS);
      if (allowedCpus().join(',') !== parseCpuList(LOAD_CPUS).join(',')) throw new Error('the benchmark process left the load\'s CPUs');
    };

    // Requests: rounds of the gateway then Sarsen at each level, both running throughout.
    const requests: Round[] = [];
    if (PARTS.has('requests')) {
      const measure = async (side: Side, c: number, database: string | null): Promise<Measured> => {
        progress(`non-streaming c=${c}: ${side.name}`);
        pinSide(side);
        const load = { url: side.url, headers: side.headers, body: chatBody, connections: c, timeoutS: 10 };
        if (WARMUP > 0) await runWrk({ ...load, durationS: WARMUP });
        const db0 = database ? await dbMark(database) : null;
        const cpu0 = treeCpuMs(side.pid);
        const pg0 = side.name === 'sarsen' ? serverCpuMs(postmaster) : 0;
        const t0 = performance.now();
        const busy = watchCpus();
        const r = await runWrk({ ...load, durationS: SECONDS });
        const wallMs = performance.now() - t0;
        const proxyMs = treeCpuMs(side.pid) - cpu0;
        const pgMs = side.name === 'sarsen' ? serverCpuMs(postmaster) - pg0 : 0;
        return { ...r, wallMs, proxyMs, pgMs, busy: busy(), db: db0 && database ? await dbWork(database, db0, r.requests) : null };
      };
      progress('starting Sarsen for the requests');
      under = await startSarsen(providerUrl!);
      for (let round = 1; round <= ROUNDS; round++) {
        for (const c of LEVELS) {
          progress(`round ${round} of ${ROUNDS}`);
          requests.push({ round, c, gateway: await measure(viaGateway, c, null), sarsen: await measure(under.side, c, under.database) });
        }
      }
      await stopSarsen();
    }

    // Streams: the gateway's ladder, then Sarsen's; the direct run at each count is measured once.
    const ladders = new Map<string, Step[]>();
    if (PARTS.has('streams')) {
      const directAt = new Map<number, LongResult>();
      const shape = (n: number): LongShape => ({ streams: n, frames: FRAMES, frameMs: FRAME_MS, arrivalMs: ARRIVAL_MS });
      const climb = async (side: Side, database: string | null): Promise<Step[]> => {
        const steps: Step[] = [];
        for (const n of LADDER) {
          if (!directAt.has(n)) {
            progress(`${n} streams: direct`);
            directAt.set(n, await runLongStreams(direct, providerUrl!, shape(n), { postmaster: null }));
          }
          progress(`${n} streams: ${side.name}`);
          pinSide(side);
          const db0 = database ? await dbMark(database) : null;
          const busy = watchCpus();
          const run = await runLongStreams(side, providerUrl!, shape(n), { postmaster: side.name === 'sarsen' ? postmaster : null });
          const wasBusy = busy();
          const d = directAt.get(n)!;
          const ratio = run.duration.p50 / d.duration.p50;
          const passed = ratio <= WITHIN && run.byteExact === n;
          steps.push({ n, run, busy: wasBusy, direct: d, ratio, passed, db: db0 && database ? await dbWork(database, db0, run.frames) : null });
          progress(`${n} streams: ${side.name} p50 ${fmt(run.duration.p50, 0)} ms, ${fmt(ratio, 3)}× direct, ${run.byteExact}/${n} byte-exact: ${passed ? 'within' : 'MISSED'}`);
          if (!passed) break;
        }
        return steps;
      };
      ladders.set('gateway', await climb(viaGateway, null));
      progress('starting Sarsen for the streams');
      under = await startSarsen(providerUrl!);
      ladders.set('sarsen', await climb(under.side, under.database));
      await stopSarsen();
    }

    report(requests, ladders);
    out();
    out(`total time: ${fmt((performance.now() - began) / 1000, 0)} s`);
  } finally {
    progress('cleaning up');
    await stopSarsen();
    await gateway?.stop().catch(() => undefined);
    await provider?.kill('SIGTERM');
    await stats?.end().catch(() => undefined);
    await shutdownDatabases();
    await owned?.stop();
  }
}

const cores = (ms: number, wallMs: number) => ms / wallMs;
const per = (x: number, n: number, digits = 2) => fmt(x / n, digits);
const pct = (share: number) => `${fmt(share * 100, 0)}%`;

function report(requests: Round[], ladders: Map<string, Step[]>): void {
  const targets: string[][] = [];

  if (requests.length > 0) {
    out(`Non-streaming, closed loop, each proxy on CPU ${PROXY_CPUS}, ${ROUNDS} rounds of the gateway then Sarsen at each level (latency in ms; CPU in cores of the run and µs a request: the proxy's processes, PostgreSQL's; per core-second: requests / (their CPU seconds); busy: the share of the proxy's and the load's CPUs used, by anything)`);
    const rows: string[][] = [];
    const perCoreSecond = (m: Measured) => m.requests / ((m.proxyMs + m.pgMs) / 1000);
    for (const c of LEVELS) {
      const ratios: number[] = [];
      for (const r of requests.filter((x) => x.c === c)) {
        for (const [name, m] of [['gateway', r.gateway], ['sarsen', r.sarsen]] as const) {
          rows.push([
            String(c), String(r.round), name, fmt(m.rate, 0), fmt(m.rate / r.gateway.rate, 2), fmt(m.p50Ms, 2), fmt(m.p99Ms, 2), describeFailures(m),
            fmt(cores(m.proxyMs, m.wallMs), 2), fmt(cores(m.pgMs, m.wallMs), 2),
            per(m.proxyMs * 1000, m.requests, 0), per(m.pgMs * 1000, m.requests, 0), per((m.proxyMs + m.pgMs) * 1000, m.requests, 0),
            fmt(perCoreSecond(m), 0), fmt(perCoreSecond(m) / perCoreSecond(r.gateway), 2), pct(m.busy.proxy), pct(m.busy.load),
          ]);
        }
        ratios.push(perCoreSecond(r.sarsen) / perCoreSecond(r.gateway));
      }
      const ratio = median(ratios);
      targets.push([`requests per core-second at c=${c}, × the gateway's (median of ${ratios.map((x) => fmt(x, 2)).join(', ')})`, '≥ 1.0', fmt(ratio, 2), verdict(ratio, 1, 'higher', '×')]);
    }
    out(table(['c', 'round', 'side', 'req/s', '× gateway', 'p50', 'p99', 'failures', 'proxy cores', 'PostgreSQL cores', 'proxy µs/req', 'PostgreSQL µs/req', 'total µs/req', 'req/core-s', '× gateway', 'proxy CPU busy', 'load CPU busy'], rows));
    // The database's work summed over the rounds; the busiest statements of the last.
    const sarsen = LEVELS.map((c) => ({ c, runs: requests.filter((r) => r.c === c && r.sarsen.db).map((r) => r.sarsen) })).filter((x) => x.runs.length > 0);
    if (sarsen.length > 0) {
      out('Sarsen\'s database per request, all rounds (its database\'s pg_stat_database and pg_stat_statements; WAL: the server\'s, which nothing else writes)');
      out(table(['run', 'rows written', 'inserted', 'updated', 'deleted', 'commits', 'statements', 'WAL bytes'], sarsen.map(({ c, runs }) =>
        dbCostRow(`c=${c}`, sumCosts(runs.map((m) => m.db!.cost)), runs.reduce((n, m) => n + m.requests, 0)))));
      for (const { c, runs } of sarsen) busiestReport(`c=${c}, round ${ROUNDS}`, 'request', runs.at(-1)!.db!);
    }
    out();
  }

  if (ladders.size > 0) {
    out(`Streams of ${FRAMES} frames ${FRAME_MS} ms apart, all opened within ${ARRIVAL_MS / 1000} s, each proxy on CPU ${PROXY_CPUS} (duration: request to last frame, p50 in ms; CPU in ms per 1,000 frames delivered)`);
    const rows: string[][] = [];
    for (const [name, steps] of ladders) {
      for (const s of steps) {
        const r = s.run;
        const pgMs = Number.isFinite(r.pgCpuMs) ? r.pgCpuMs : 0;
        rows.push([
          String(s.n), name, `${r.byteExact}/${s.n}`, fmt(s.direct.duration.p50, 0), fmt(r.duration.p50, 0), fmt(s.ratio, 3), s.passed ? 'within' : 'MISSED',
          per(r.cpuMs * 1000, r.frames), per(pgMs * 1000, r.frames), per((r.cpuMs + pgMs) * 1000, r.frames), fmt(r.peakRssMb, 0), pct(s.busy.proxy), pct(s.busy.load), r.failures,
        ]);
      }
    }
    out(table(['streams', 'side', 'byte-exact', 'direct p50', 'p50', '× direct', `≤ ${WITHIN}×`, 'proxy ms/1k frames', 'PostgreSQL', 'total', 'peak RSS MB', 'proxy CPU busy', 'load CPU busy', 'failures'], rows));
    const slow = [...new Set([...ladders.values()].flat().map((s) => s.direct))].filter((d) => d.duration.p50 > ((FRAMES - 1) * FRAME_MS) * WITHIN);
    if (slow.length > 0) out(`NOTE: the direct run itself took over ${WITHIN}× the provider's schedule at ${slow.map((d) => d.started).join(', ')} streams: the load's CPUs, not the proxy, bound those counts`);
    const sarsenSteps = (ladders.get('sarsen') ?? []).filter((s) => s.db);
    if (sarsenSteps.length > 0) {
      out('Sarsen\'s database per frame delivered');
      out(table(['run', 'rows written', 'inserted', 'updated', 'deleted', 'commits', 'statements', 'WAL bytes'], sarsenSteps.map((s) => dbCostRow(`${s.n} streams`, s.db!.cost, s.run.frames))));
      const last = sarsenSteps.at(-1)!;
      busiestReport(`${last.n} streams`, 'frame', last.db!);
    }
    const capacity = (steps: Step[] | undefined) => {
      if (!steps || steps.length === 0) return { n: NaN, text: 'not measured' };
      const passed = steps.filter((s) => s.passed);
      const n = passed.at(-1)?.n ?? 0;
      const atTop = steps.at(-1)!.passed;
      return { n, text: `${atTop ? '≥ ' : ''}${n}${n === 0 ? ` (missed at ${steps[0]!.n})` : ''}` };
    };
    const gw = capacity(ladders.get('gateway'));
    const s = capacity(ladders.get('sarsen'));
    out(`Streams per core (the largest count within ${WITHIN}× the direct run's p50 duration): the gateway ${gw.text}, Sarsen ${s.text}`);
    const streamsRatio = gw.n === 0 ? NaN : s.n / gw.n; // the gateway missed the first count: start the ladder lower
    targets.push([`streams per core, × the gateway's`, '≥ 0.8', `${fmt(streamsRatio, 2)} (${s.text} / ${gw.text})`, verdict(streamsRatio, 0.8, 'higher', '×')]);
    // CPU a frame compared at the largest count both proxies ran: at small counts an idle
    // proxy's housekeeping weighs on each frame.
    const at = (ladders.get('sarsen') ?? []).map((x) => x.n).filter((n) => ladders.get('gateway')?.some((g) => g.n === n)).at(-1);
    if (at !== undefined) {
      const g = ladders.get('gateway')!.find((x) => x.n === at)!.run;
      const r = ladders.get('sarsen')!.find((x) => x.n === at)!.run;
      const ratio = (r.cpuMs + r.pgCpuMs) / r.frames / (g.cpuMs / g.frames);
      out(`CPU per 1,000 frames at ${at} streams: Sarsen ${per(r.cpuMs * 1000, r.frames)} ms + PostgreSQL ${per(r.pgCpuMs * 1000, r.frames)} ms, the gateway ${per(g.cpuMs * 1000, g.frames)} ms: ${fmt(ratio, 2)}×`);
      targets.push([`CPU per 1,000 frames at ${at} streams, Sarsen's and PostgreSQL's, × the gateway's`, '≤ 1.5', fmt(ratio, 2), verdict(ratio, 1.5, 'lower', '×')]);
    }
    out();
  }

  out(`Sarsen ran ${sarsenProcesses} process(es) by its default.`);
  out();
  out('Targets (issue 44: the proxy pinned to one core)');
  out(table(['measure', 'target', 'measured', 'verdict'], targets));
}

function busiestReport(what: string, unit: string, db: DbWork): void {
  if (db.busiest.length === 0) return;
  out(`  its busiest statements at ${what}: calls a ${unit}, rows and WAL bytes a call, mean execution ms`);
  out(table(['calls', 'rows', 'WAL', 'ms', 'statement'], db.busiest.map((b) => [fmt(b.perUnit, 3), fmt(b.rowsPerCall, 1), fmt(b.walPerCall, 0), fmt(b.meanMs, 3), b.query.length > 100 ? `${b.query.slice(0, 100)}…` : b.query])).replace(/^/gm, '  '));
}

function sumCosts(costs: DbCost[]): DbCost {
  return costs.reduce((a, b) => Object.fromEntries(Object.keys(a).map((k) => [k, a[k as keyof DbCost] + b[k as keyof DbCost]])) as DbCost);
}

function dbCostRow(what: string, d: DbCost, n: number): string[] {
  return [what, per(d.rows, n, 3), per(d.inserted, n, 3), per(d.updated, n, 3), per(d.deleted, n, 3), per(d.commits, n, 3), per(d.statements, n, 3), per(d.walBytes, n, 0)];
}

await main();
