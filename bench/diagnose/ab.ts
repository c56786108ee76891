// Two builds of Sarsen against each other: this checkout against a base commit, each compiled as
// the image runs it, each a child on a fresh database of its own, both started before the first
// round and loaded in turn (the base first in odd rounds, this checkout first in even ones) with
// wrk at each concurrency, every body distinct. A change's effect is judged by the ratio of the
// two builds in the same round: it does not carry the gateway's own spread between runs, which on
// a noisy machine is larger than most changes (docs/performance.md "What bounds the figures").
//
// Run: node bench/diagnose/ab.ts --base <commit> [--concurrency 16,64 --rounds 4 --seconds 8 --warmup 2]
// A runtime setting is judged the same way, one build against itself: --base HEAD --head-env
// NODE_OPTIONS=... (the head's child only; --child-env goes to both).
// The base is checked out with `git archive` into a temporary directory and compiled with this
// checkout's TypeScript and node_modules: a base whose dependencies differ is not comparable.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import { shutdownDatabases } from '../../test/support/db.ts';
import { spawnNode, type SarsenChild } from '../../test/support/child.ts';
import { createPool } from '../../src/db/pool.ts';
import { benchDatabase } from '../lib/database.ts';
import { startBenchSarsen, compiledMain, childEnv, type BenchSarsen } from '../lib/sarsen-child.ts';
import { provisionChat } from '../lib/provision.ts';
import { runWrk, wrkVersion, describeFailures } from '../lib/wrk.ts';
import { postmasterPid, serverCpuMs, machineCpuMs } from '../lib/cpu.ts';
import { treeCpuMs } from '../lib/process-tree.ts';
import { fmt, median, table } from '../lib/stats.ts';
import { benchArgs } from '../lib/args.ts';

const args = benchArgs({
  base: { type: 'string' },
  concurrency: { type: 'string', default: '16,64' },
  rounds: { type: 'string', default: '4' },
  seconds: { type: 'string', default: '8' },
  warmup: { type: 'string', default: '2' },
  'allow-non-durable': { type: 'boolean', default: false },
  // Environment of both Sarsen children beyond the runtime settings: --child-env NODE_OPTIONS=...
  'child-env': { type: 'string', multiple: true, default: [] },
  // The head's child only, over --child-env: a runtime setting against the same build (--base HEAD).
  'head-env': { type: 'string', multiple: true, default: [] },
});
const LEVELS = args.concurrency.split(',').map(Number);
const ROUNDS = Number(args.rounds);
const SECONDS = Number(args.seconds);
const WARMUP = Number(args.warmup);
if (!args.base || ![ROUNDS, SECONDS, WARMUP, ...LEVELS].every((n) => Number.isInteger(n) && n >= 0) || ROUNDS < 1 || SECONDS < 1 || LEVELS.some((c) => c < 1)) {
  throw new Error('usage: --base <commit> --concurrency 16,64 --rounds N (≥ 1) --seconds N (≥ 1) --warmup N');
}
const CHILD_ENV = childEnv(args['child-env']);
const HEAD_ENV = childEnv([...args['child-env'], ...args['head-env']]);
const envOf = (name: Build['name']) => (name === 'head' ? HEAD_ENV : CHILD_ENV);
const describeEnv = (env: Record<string, string>) => Object.entries(env).map(([k, v]) => `${k}=${v}`).join(' ');
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const TAG = Math.random().toString(36).slice(2, 8);
const BODY = `{"model":"gpt-bench","messages":[{"role":"user","content":"ab ${TAG} {n}"}]}`;

const out = (line = '') => process.stdout.write(line + '\n');
const progress = (line: string) => process.stderr.write(`[bench:ab] ${line}\n`);

type Build = { name: 'base' | 'head'; what: string; main: string };
type Running = Build & { sarsen: BenchSarsen; pool: pg.Pool; url: string; headers: Record<string, string> };
/** One build's run at one level: requests a second, and CPU µs a request (its process tree; the whole PostgreSQL server). */
type Run = { rate: number; p50Ms: number; sarsenUs: number; pgUs: number; busy: number; failures: string | null };

/** The base commit's sources in a temporary directory (removed at exit). */
function checkout(commit: string): { dir: string; what: string } {
  const sha = execFileSync('git', ['-C', ROOT, 'rev-parse', '--verify', `${commit}^{commit}`], { encoding: 'utf8' }).trim();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-ab-base-'));
  process.once('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  const archive = path.join(dir, 'base.tar');
  execFileSync('git', ['-C', ROOT, 'archive', '--format=tar', '-o', archive, sha]);
  execFileSync('tar', ['-xf', archive, '-C', dir]);
  fs.rmSync(archive);
  // Its imports' types resolve from this checkout's packages, as its code will run with them.
  fs.symlinkSync(path.join(ROOT, 'node_modules'), path.join(dir, 'node_modules'));
  return { dir, what: sha.slice(0, 7) };
}

function describeHead(): string {
  const sha = execFileSync('git', ['-C', ROOT, 'rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  const dirty = execFileSync('git', ['-C', ROOT, 'status', '--porcelain', '--', 'src', 'sql'], { encoding: 'utf8' }).trim() !== '';
  return `${sha}${dirty ? ' with uncommitted changes' : ''}`;
}

async function start(build: Build, providerUrl: string): Promise<Running> {
  const sarsen = await startBenchSarsen({ settings: { shutdown_grace_ms: 5_000 }, env: envOf(build.name), main: build.main });
  const pool = createPool(sarsen.db.conn, { max: 2, name: 'sarsen-bench' });
  const tenant = await provisionChat(sarsen.url, pool, providerUrl);
  return { ...build, sarsen, pool, url: `${sarsen.url}${tenant.basePath}/chat/completions`, headers: { 'content-type': 'application/json', 'x-sarsen-key': tenant.key } };
}

async function measure(r: Running, c: number, postmaster: number | null): Promise<Run> {
  const load = { url: r.url, headers: r.headers, body: BODY, connections: c, timeoutS: 10 };
  if (WARMUP > 0) await runWrk({ ...load, durationS: WARMUP });
  const pid = r.sarsen.child.child.pid!;
  const [cpu0, pg0, machine0, t0] = [treeCpuMs(pid), serverCpuMs(postmaster), machineCpuMs(), performance.now()];
  const w = await runWrk({ ...load, durationS: SECONDS });
  const wallMs = performance.now() - t0;
  const perRequest = (ms: number) => (ms * 1000) / Math.max(1, w.requests);
  const failures = describeFailures(w);
  return {
    rate: w.rate, p50Ms: w.p50Ms,
    sarsenUs: perRequest(treeCpuMs(pid) - cpu0), pgUs: perRequest(serverCpuMs(postmaster) - pg0),
    busy: (machineCpuMs().busy - machine0.busy) / wallMs,
    failures: failures === 'none' ? null : failures,
  };
}

/** `head ÷ base` of each round, as "median (least-most)". */
function ratios(pairs: [Run, Run][], of: (r: Run) => number): string {
  const rs = pairs.map(([base, head]) => of(head) / of(base)).sort((a, b) => a - b);
  return `${fmt(median(rs), 3)} (${fmt(rs[0]!, 3)}-${fmt(rs.at(-1)!, 3)})`;
}

async function main(): Promise<void> {
  const db = await benchDatabase({ allowNonDurable: args['allow-non-durable'] });
  const wrk = wrkVersion();
  if (!wrk) throw new Error('wrk is not installed (Debian: apt-get install wrk); this benchmark uses it as its load generator.');
  const base = checkout(args.base!);
  const builds: Build[] = [
    { name: 'base', what: base.what, main: compiledMain(base.dir) },
    { name: 'head', what: describeHead(), main: compiledMain() },
  ];
  let provider: SarsenChild | null = null;
  const running: Running[] = [];
  try {
    provider = spawnNode(path.join(ROOT, 'bench/lib/provider-process.ts'), [], process.env, 'bench provider');
    const [, providerUrl] = await provider.waitFor(/listening (http:\S+)/, 30_000);
    for (const b of builds) running.push(await start(b, providerUrl!));
    const postmaster = await postmasterPid(running[0]!.pool).catch(() => null);

    out(`Sarsen A/B benchmark — ${new Date().toISOString()}`);
    out(`machine: ${os.cpus().length} × ${os.cpus()[0]?.model ?? '?'}, load average ${os.loadavg().map((l) => fmt(l, 2)).join(' ')}; node ${process.version}; ${wrk}`);
    out(`database: ${db.describe}`);
    out(`base ${builds[0]!.what} against head ${builds[1]!.what}: both compiled, role both, one process each, ${describeEnv(CHILD_ENV)}${args['head-env'].length > 0 ? ` (the head: ${describeEnv(HEAD_ENV)})` : ''}; both running throughout, loaded in turn; ${ROUNDS} rounds; ${SECONDS} s measured after ${WARMUP} s of warm-up; every body distinct`);
    out();

    const runs = new Map<number, [Run, Run][]>(LEVELS.map((c) => [c, []]));
    const rows: string[][] = [];
    for (let round = 1; round <= ROUNDS; round++) {
      for (const c of LEVELS) {
        const order = round % 2 === 1 ? running : [...running].reverse();
        const got = new Map<string, Run>();
        for (const r of order) {
          progress(`round ${round} of ${ROUNDS}, c=${c}: ${r.name}`);
          const m = await measure(r, c, postmaster);
          got.set(r.name, m);
          rows.push([String(c), String(round), r.name, fmt(m.rate, 0), fmt(m.p50Ms, 2), fmt(m.sarsenUs, 0), fmt(m.pgUs, 0), fmt(m.sarsenUs + m.pgUs, 0), fmt(m.busy, 2), m.failures ?? 'none']);
        }
        runs.get(c)!.push([got.get('base')!, got.get('head')!]);
      }
    }
    out('Non-streaming, closed loop, provider answering at once (latency in ms; CPU in µs a request: Sarsen\'s process, the PostgreSQL server; busy: the machine\'s cores)');
    out(table(['c', 'round', 'build', 'req/s', 'p50', 'Sarsen µs', 'PostgreSQL µs', 'total µs', 'busy', 'failures'], rows));
    out();
    out('head ÷ base, round by round: median (least-most); above 1 the head serves more, or spends more CPU');
    out(table(['c', 'req/s', 'Sarsen µs a request', 'PostgreSQL µs', 'total µs'], LEVELS.map((c) => {
      const pairs = runs.get(c)!;
      return [String(c), ratios(pairs, (r) => r.rate), ratios(pairs, (r) => r.sarsenUs), ratios(pairs, (r) => r.pgUs), ratios(pairs, (r) => r.sarsenUs + r.pgUs)];
    })));
  } finally {
    progress('cleaning up');
    for (const r of running) {
      await r.pool.end().catch(() => undefined);
      await r.sarsen.stop().catch((err) => progress(`stopping Sarsen failed: ${err}`));
    }
    if (provider) await provider.kill('SIGTERM').catch(() => undefined);
    await shutdownDatabases();
  }
}

await main();
