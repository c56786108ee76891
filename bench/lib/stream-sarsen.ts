// The Sarsen side of the streaming benchmark: a real `sarsen` child process (role both unless
// told) on a fresh database, provisioned through its administration routes like an operator
// would, and its memory and CPU read from /proc.
import fs from 'node:fs';
import crypto from 'node:crypto';
import type pg from 'pg';
import { createTestDatabase, testPool, type TestDatabase } from '../../test/support/db.ts';
import { makeSecretsDir, sarsenEnv, type SarsenChild } from '../../test/support/child.ts';
import { call, createTenancy, signInAndChoose } from '../../test/support/control-plane.ts';
import type { Settings } from '../../src/config/settings.ts';
import { SARSEN_RUNTIME_ENV, spawnBenchSarsen } from './sarsen-child.ts';

export type StreamSarsen = {
  url: string;
  pid: number;
  db: TestDatabase;
  pool: pg.Pool;
  child: SarsenChild;
  /** SIGTERM, SIGKILL after `graceMs`; then the pool closes and the database is dropped. Safe to call twice. */
  stop(graceMs?: number): Promise<void>;
};

export async function startStreamSarsen(opts: { role?: string; settings?: Partial<Settings>; env?: Record<string, string> } = {}): Promise<StreamSarsen> {
  const db = await createTestDatabase(opts.settings);
  const secrets = makeSecretsDir(db.conn);
  const pool = testPool(db.conn, 2);
  const child = spawnBenchSarsen(['--role', opts.role ?? 'both', '--port', '0', '--host', '127.0.0.1'], sarsenEnv(db.conn, secrets.dir, { ...SARSEN_RUNTIME_ENV, ...opts.env }));
  let stopping: Promise<void> | null = null;
  const stop = (graceMs = 10_000) =>
    (stopping ??= (async () => {
      if (child.child.exitCode === null && child.child.signalCode === null) {
        const timer = setTimeout(() => child.child.kill('SIGKILL'), graceMs);
        await child.kill('SIGTERM');
        clearTimeout(timer);
      }
      secrets.remove();
      await pool.end();
      await db.drop();
    })());
  try {
    const [, url] = await child.waitFor(/"url":"(http:[^"]+)"/, 60_000);
    return { url: url!, pid: child.child.pid!, db, pool, child, stop };
  } catch (err) {
    await stop(2_000);
    throw err;
  }
}

export type StreamTenant = { path: string; key: string };

/** A tenancy, namespace, chat backend on `providerUrl`, a `gpt-*` rule and a key. */
export async function provisionStreaming(s: StreamSarsen, providerUrl: string): Promise<StreamTenant> {
  const tenancy = `bench-stream-${crypto.randomBytes(3).toString('hex')}`;
  const { token } = await signInAndChoose(s.url, await createTenancy(s.pool, tenancy));
  const admin = async (path: string, body: unknown) => {
    const res = await call(s.url, 'POST', `/${tenancy}/v1${path}`, { token, body });
    if (res.status >= 300) throw new Error(`POST ${path}: ${res.status} ${res.text}`);
    return res.body;
  };
  await admin('/namespaces', { name: 'main' });
  const backend = await admin('/namespaces/main/backends', { name: 'chat', kind: 'chat_compat', address: `${providerUrl}/v1`, credential: 'sk-bench-stream' });
  await admin('/namespaces/main/routing-rules', { model: 'gpt-*', backend_id: backend.backend_id });
  const key = await admin('/namespaces/main/api-keys', { name: 'bench', grants: ['use'] });
  return { path: `/${tenancy}/main/v1/chat/completions`, key: key.key as string };
}

/** VmRSS and VmHWM (peak) of a process in MB; NaN when /proc cannot be read. */
export function memoryMb(pid: number): { rss: number; hwm: number } {
  try {
    const text = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    const kb = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? NaN);
    return { rss: kb('VmRSS') / 1024, hwm: kb('VmHWM') / 1024 };
  } catch {
    return { rss: NaN, hwm: NaN };
  }
}

/** User + system CPU time of a process in ms (NaN when unreadable). */
export function cpuMs(pid: number): number {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return ((Number(f[11]) + Number(f[12])) * 1000) / 100; // USER_HZ
  } catch {
    return NaN;
  }
}

/**
 * CPU time (ms) of the PostgreSQL server listening on `port` (its postmaster, found by its
 * command line, and every process it started); other servers on the machine are not counted.
 */
export function postgresCpuMs(port: number): number {
  const procs: { pid: number; ppid: number; ms: number; cmd: string }[] = [];
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${entry}/stat`, 'utf8');
      if (stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')')) !== 'postgres') continue;
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      const cmd = fs.readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0').join(' ');
      procs.push({ pid: Number(entry), ppid: Number(f[1]), ms: ((Number(f[11]) + Number(f[12])) * 1000) / 100, cmd });
    } catch {
      // the process ended while we looked
    }
  }
  const master = procs.find((p) => new RegExp(`(^|\\s)-p ${port}(\\s|$)`).test(p.cmd));
  if (!master) return NaN;
  return procs.filter((p) => p.pid === master.pid || p.ppid === master.pid).reduce((sum, p) => sum + p.ms, 0);
}

/** Samples VmRSS every `everyMs` until stopped; answers the highest seen. */
export function sampleRss(pid: number, everyMs = 50): { stop(): number } {
  let peak = memoryMb(pid).rss;
  const timer = setInterval(() => {
    const { rss } = memoryMb(pid);
    if (rss > peak || !Number.isFinite(peak)) peak = rss;
  }, everyMs);
  return {
    stop() {
      clearInterval(timer);
      return peak;
    },
  };
}
