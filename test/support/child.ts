// Real `sarsen` processes for tests: the command as users run it, with the environment
// pointing at a test database and a temporary secrets directory.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import crypto from 'node:crypto';
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { ConnectionConfig } from '../../src/db/pool.ts';
import { track } from './resources.ts';
import { registerOutput } from './log-guard.ts';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const MAIN = path.join(ROOT, 'src/main.ts');

export type SecretsDir = { dir: string; files: Record<string, string>; remove(): void };

/** A secrets directory with all three files (the database password is the test server's). */
export function makeSecretsDir(conn: ConnectionConfig, omit: string[] = []): SecretsDir {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-secrets-'));
  const files: Record<string, string> = {
    'credential-key': crypto.randomBytes(32).toString('base64url'),
    'api-key-hash-key': crypto.randomBytes(32).toString('base64url'),
    'database-password': conn.password ?? 'trust-auth-ignores-this',
  };
  for (const [name, value] of Object.entries(files)) {
    if (!omit.includes(name)) fs.writeFileSync(path.join(dir, name), value + '\n', { mode: 0o600 });
  }
  return { dir, files, remove: () => fs.rmSync(dir, { recursive: true, force: true }) };
}

export function sarsenEnv(conn: ConnectionConfig, secretsDir: string, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const key of Object.keys(env)) if (key.startsWith('CTX_')) delete env[key];
  return {
    ...env,
    CTX_DATABASE_HOST: conn.host,
    CTX_DATABASE_PORT: String(conn.port),
    CTX_DATABASE_USER: conn.user,
    CTX_DATABASE_NAME: conn.database,
    CTX_SECRETS_DIR: secretsDir,
    CTX_PROCESSES: '1', // one process per child, as the tests count them; a test passes --processes
    ...extra,
  };
}

export type SarsenChild = {
  child: ChildProcess;
  output(): string; // stdout + stderr so far
  waitFor(pattern: RegExp, timeoutMs?: number): Promise<RegExpMatchArray>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  kill(signal?: NodeJS.Signals): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
};

/** Spawns `node src/main.ts ...args` (Node 24 is `process.execPath` under the npm scripts). */
export function spawnSarsen(args: string[], env: NodeJS.ProcessEnv): SarsenChild {
  return spawnNode(MAIN, args, env, 'sarsen');
}

/** Spawns `node script ...args` with its output collected (benchmarks run their helpers this way). */
export function spawnNode(script: string, args: string[], env: NodeJS.ProcessEnv = process.env, label = script): SarsenChild {
  return spawnProcess(process.execPath, [script, ...args], { env, label });
}

/**
 * Spawns any program with its output collected, every line of it checked by the log guard.
 * `detached` gives it a process group of its own, so a test can signal the group as a
 * terminal's Ctrl-C does (`process.kill(-pid)`).
 */
export function spawnProcess(file: string, args: string[], opts: { env?: NodeJS.ProcessEnv; cwd?: string; detached?: boolean; label?: string } = {}): SarsenChild {
  const child = spawn(file, args, { env: opts.env ?? process.env, cwd: opts.cwd, detached: opts.detached, stdio: ['ignore', 'pipe', 'pipe'] });
  const release = track('child process', `${opts.label ?? file} ${args.join(' ')}`);
  let out = '';
  const waiters = new Set<() => void>();
  // Every line of every child goes to the log guard as it arrives, one stream at a time.
  const guarded = (stream: NodeJS.ReadableStream) => {
    let partial = '';
    stream.on('data', (b: Buffer) => {
      const text = b.toString('utf8');
      out += text;
      const lines = (partial + text).split('\n');
      partial = lines.pop()!;
      registerOutput(lines.join('\n'));
      for (const w of waiters) w();
    });
    stream.on('end', () => registerOutput(partial));
  };
  guarded(child.stdout!);
  guarded(child.stderr!);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.once('exit', (code, signal) => {
      release();
      for (const w of waiters) w();
      resolve({ code, signal });
    });
  });
  return {
    child,
    output: () => out,
    exited,
    waitFor(pattern, timeoutMs = 30_000) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const m = out.match(pattern);
          if (m) return done(() => resolve(m));
          if (child.exitCode !== null || child.signalCode !== null) {
            return done(() => reject(new Error(`process exited before printing ${pattern}; output:\n${out}`)));
          }
        };
        const timer = setTimeout(() => done(() => reject(new Error(`timed out waiting for ${pattern}; output:\n${out}`))), timeoutMs);
        const done = (fn: () => void) => {
          clearTimeout(timer);
          waiters.delete(check);
          fn();
        };
        waiters.add(check);
        check();
      });
    },
    async kill(signal = 'SIGTERM') {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      return exited;
    },
  };
}
