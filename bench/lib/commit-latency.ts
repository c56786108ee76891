// What one durable commit costs on this machine, twice: with the CPUs idle, and with every CPU
// kept busy by spinning processes at the lowest priority (docs/performance.md "What bounds the
// figures"). On nested virtual machines a disk flush that completes while every vCPU is busy is
// noticed late, so a commit under load can cost many times what it costs alone. That, not PostgreSQL's
// CPU, then bounds a durable proxy at moderate concurrency, and a stateless gateway never pays it.
// The figure is the p50 of one-row INSERTs through node-pg, each its own transaction, on one
// connection to a fresh database of the benchmark's server.
import { spawn, type ChildProcess } from 'node:child_process';
import os from 'node:os';
import pg from 'pg';
import { createTestDatabase } from '../../test/support/db.ts';
import { median } from './stats.ts';
import { allowedCpus, hasTaskset } from './pin.ts';

const SECONDS = 2;

export type CommitLatency = { idleMs: number; busyMs: number };

async function commitsFor(client: pg.Client, ms: number): Promise<number> {
  const took: number[] = [];
  const until = performance.now() + ms;
  for (let i = 0; performance.now() < until; i++) {
    const start = performance.now();
    await client.query({ name: 'probe', text: 'INSERT INTO commit_probe (n, pad) VALUES ($1, $2)', values: [i, 'x'.repeat(200)] });
    took.push(performance.now() - start);
  }
  return median(took);
}

// One spinner on each CPU this process may use, pinned there when taskset is at hand: two left to
// the scheduler may share one CPU for seconds, leaving the other idle. Each stops by itself soon
// after the measurement, should this process die before it kills them.
function spinners(): ChildProcess[] {
  const pin = hasTaskset();
  return allowedCpus().map((cpu) => {
    const spin = [process.execPath, '-e', `const end = Date.now() + ${(SECONDS + 3) * 1000}; while (Date.now() < end);`];
    const [command, ...args] = pin ? ['taskset', '-c', String(cpu), ...spin] : spin;
    const child = spawn(command!, args, { stdio: 'ignore' });
    try {
      os.setPriority(child.pid!, 19);
    } catch {
      // Already gone or not ours to renice: it spins at the default priority.
    }
    return child;
  });
}

/** `measure` on a connection to a fresh database holding the probe's table, after a warm-up. */
async function withProbe<T>(measure: (client: pg.Client) => Promise<T>): Promise<T> {
  const db = await createTestDatabase();
  const client = new pg.Client(db.conn);
  client.on('error', () => undefined);
  try {
    await client.connect();
    await client.query('CREATE TABLE commit_probe (id bigserial PRIMARY KEY, n int, pad text)');
    await commitsFor(client, 300); // warm-up
    return await measure(client);
  } finally {
    await client.end().catch(() => undefined);
    await db.drop();
  }
}

/**
 * The p50 of one-row durable commits over `seconds`, as the machine is now (the c=1 floor's
 * commit, measured beside each c=1 round: docs/performance.md "Targets").
 */
export const measureCommitNow = (seconds: number): Promise<number> => withProbe((client) => commitsFor(client, seconds * 1000));

export function measureCommitLatency(): Promise<CommitLatency> {
  return withProbe(async (client) => {
    const idleMs = await commitsFor(client, SECONDS * 1000);
    const spinning = spinners();
    try {
      await new Promise((resolve) => setTimeout(resolve, 200));
      return { idleMs, busyMs: await commitsFor(client, SECONDS * 1000) };
    } finally {
      for (const child of spinning) child.kill('SIGKILL');
    }
  });
}

export const describeCommitLatency = (c: CommitLatency): string =>
  `a durable one-row commit through node-pg, p50 ${c.idleMs.toFixed(2)} ms with the CPUs idle, ${c.busyMs.toFixed(2)} ms with every CPU busy (spinning at the lowest priority)`;
