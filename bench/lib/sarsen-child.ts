// A real Sarsen process for benchmarks: `node src/main.ts --port 0` (role both unless told)
// against a fresh database from the test harness, with its own secrets directory. Stopping it
// is bounded: SIGTERM, SIGKILL after a grace, then the database is dropped.
import { createTestDatabase, type TestDatabase } from '../../test/support/db.ts';
import { makeSecretsDir, sarsenEnv, spawnSarsen, type SarsenChild } from '../../test/support/child.ts';
import type { Settings } from '../../src/config/settings.ts';

/**
 * The runtime settings Sarsen runs with wherever it is started for real (npm start, the
 * image): fewer glibc malloc arenas, and a V8 young generation of at most 16 MB a
 * semi-space (left alone, V8 sizes it for the machine's memory and lets a busy process's heap
 * balloon). Benchmarks run Sarsen the same way.
 */
export const SARSEN_RUNTIME_ENV: Record<string, string> = { MALLOC_ARENA_MAX: '2', NODE_OPTIONS: '--max-semi-space-size=16' };

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
  const child = spawnSarsen(['--port', '0', '--host', '127.0.0.1', ...(opts.args ?? [])], sarsenEnv(conn, secrets.dir, { ...SARSEN_RUNTIME_ENV, ...opts.env }));
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
    const m = await child.waitFor(/"message":"sarsen listening"[^\n]*"url":"(http:\/\/[^"]+)"|"url":"(http:\/\/[^"]+)"[^\n]*"message":"sarsen listening"/, 60_000);
    return { url: m[1] ?? m[2]!, db, child, stop };
  } catch (err) {
    await stop(2_000);
    throw err;
  }
}
