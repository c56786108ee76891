// A real Sarsen process for benchmarks, run as the image runs it (see `compiledMain`):
// `node main.js --port 0` (role both unless told) against a fresh database from the test
// harness, with its own secrets directory. Stopping it is bounded: SIGTERM, SIGKILL after a
// grace, then the database is dropped.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { createTestDatabase, type TestDatabase } from '../../test/support/db.ts';
import { makeSecretsDir, sarsenEnv, spawnNode, type SarsenChild } from '../../test/support/child.ts';
import type { Settings } from '../../src/config/settings.ts';
import { runtimeSettings } from '../../src/core/runtime-flags.ts';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const built = new Map<string, string>();

/**
 * Sarsen compiled (`tsc -p tsconfig.build.json`) into a temporary directory laid out as the
 * image lays out /app (the SQL and the console's pages beside the code, package.json, the
 * project's node_modules), once per benchmark process; answers its main script. Run from its
 * TypeScript sources, Node also holds its type stripper for the life of the process
 * (docs/measurements.md "Memory"), and the image never runs that way. `root`: another checkout's
 * sources (bench/diagnose/ab.ts builds a base commit), compiled with this checkout's TypeScript and run
 * with its node_modules.
 */
export function compiledMain(root = ROOT): string {
  const done = built.get(root);
  if (done) return done;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-bench-build-'));
  process.once('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  process.stderr.write(`[bench] compiling Sarsen${root === ROOT ? '' : ` from ${root}`} as the image runs it (tsc -p tsconfig.build.json)\n`);
  execFileSync(process.execPath, [path.join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', path.join(root, 'tsconfig.build.json'), '--outDir', dir], { stdio: 'inherit' });
  fs.cpSync(path.join(root, 'sql'), path.join(dir, 'sql'), { recursive: true });
  fs.cpSync(path.join(root, 'src/http/console/static'), path.join(dir, 'src/http/console/static'), { recursive: true });
  fs.copyFileSync(path.join(root, 'package.json'), path.join(dir, 'package.json'));
  fs.symlinkSync(path.join(ROOT, 'node_modules'), path.join(dir, 'node_modules'));
  const main = path.join(dir, 'src/main.js');
  built.set(root, main);
  return main;
}

/** Spawns the compiled Sarsen (`main`: another build's, from compiledMain) with `args`. */
export function spawnBenchSarsen(args: string[], env: NodeJS.ProcessEnv, main = compiledMain()): SarsenChild {
  return spawnNode(main, args, env, 'sarsen');
}

/**
 * The runtime settings bin/sarsen.js gives Sarsen wherever it is started for real (npm start,
 * the image) on a machine without a memory limit (docs/operations.md "Runtime memory
 * settings"). Benchmarks start main.js directly, so they set them here, from the same rule.
 */
const RUNTIME = runtimeSettings({ constrained: undefined, total: os.totalmem(), given: [], env: {} });
export const SARSEN_RUNTIME_ENV: Record<string, string> = { ...RUNTIME.env, NODE_OPTIONS: RUNTIME.flags.join(' ') };

export type BenchSarsen = {
  url: string;
  db: TestDatabase;
  child: SarsenChild;
  /** SIGTERM, SIGKILL after `graceMs`; then the database is dropped. Safe to call twice. */
  stop(graceMs?: number): Promise<void>;
};

export type BenchSarsenOptions = {
  settings?: Partial<Settings>;
  args?: string[];
  /** Extra environment for the child, over SARSEN_RUNTIME_ENV (NODE_OPTIONS for --cpu-prof, for instance). */
  env?: Record<string, string>;
  /** Where the child connects, when not the database server itself (a profiling proxy). */
  via?: { host: string; port: number };
  /** `--processes`: more than one waits for every worker to be ready; 'default' passes none (nor CTX_PROCESSES), as a user starts it. */
  processes?: number | 'default';
  /** The build to run (compiledMain of another checkout); this checkout's by default. */
  main?: string;
};

export async function killWithGrace(child: SarsenChild, graceMs: number): Promise<void> {
  if (child.child.exitCode !== null || child.child.signalCode !== null) return;
  const timer = setTimeout(() => child.child.kill('SIGKILL'), graceMs);
  try {
    await child.kill('SIGTERM');
  } finally {
    clearTimeout(timer);
  }
}

export async function startBenchSarsen(opts: BenchSarsenOptions = {}): Promise<BenchSarsen> {
  const db = await createTestDatabase(opts.settings);
  const secrets = makeSecretsDir(db.conn);
  const conn = opts.via ? { ...db.conn, host: opts.via.host, port: opts.via.port } : db.conn;
  const processes = opts.processes ?? 1;
  const env = sarsenEnv(conn, secrets.dir, { ...SARSEN_RUNTIME_ENV, ...opts.env });
  if (processes === 'default') delete env.CTX_PROCESSES;
  const count = processes === 'default' ? [] : ['--processes', String(processes)];
  const child = spawnBenchSarsen(['--port', '0', '--host', '127.0.0.1', ...count, ...(opts.args ?? [])], env, opts.main);
  let stopping: Promise<void> | null = null;
  const stop = (graceMs = 15_000) =>
    (stopping ??= (async () => {
      try {
        await killWithGrace(child, graceMs);
      } finally {
        secrets.remove();
        await db.drop();
      }
    })());
  try {
    // Sarsen's default count is not known here: a primary says ready, a lone process listening.
    const ready = processes === 'default' ? '(?:sarsen ready|sarsen listening)' : processes > 1 ? 'sarsen ready' : 'sarsen listening';
    const m = await child.waitFor(new RegExp(`"message":"${ready}"[^\\n]*"url":"(http://[^"]+)"|"url":"(http://[^"]+)"[^\\n]*"message":"${ready}"`), 60_000);
    return { url: m[1] ?? m[2]!, db, child, stop };
  } catch (err) {
    await stop(2_000);
    throw err;
  }
}

/** The Sarsen children's environment: the runtime settings, then each --child-env NAME=VALUE given. */
export function childEnv(given: readonly string[]): Record<string, string> {
  const env: Record<string, string> = { ...SARSEN_RUNTIME_ENV };
  for (const kv of given) {
    const at = kv.indexOf('=');
    if (at < 1) throw new Error(`--child-env takes NAME=VALUE, not ${kv}`);
    env[kv.slice(0, at)] = kv.slice(at + 1);
  }
  return env;
}
