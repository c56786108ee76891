// Per-request timestamps, to follow the slowest requests end to end (`bench:compare --trace`).
// Off unless SARSEN_TRACE names a file prefix, read once at startup: then each process appends
// to `<prefix>.<pid>` a line per milestone, `<request id> <stage> <epoch ms> [<batch size>]`,
// and `- gc <epoch ms> <ms>` / `- stall <epoch ms> <ms>` for the pauses of its event loop.
// Off, a call site costs the test of a constant (`if (TRACING) trace(...)`).
import fs from 'node:fs';
import { PerformanceObserver } from 'node:perf_hooks';

const PREFIX = process.env.SARSEN_TRACE || null;
export const TRACING: boolean = PREFIX !== null;

// Pauses shorter than these are not worth a line.
const GC_MS = 5;
const STALL_TICK_MS = 10;
const STALL_MS = 20;
const FLUSH_MS = 100;

let pending: string[] = [];

/** Now, in ms since the epoch: a clock every process on the machine shares. */
export const traceNow = (): number => performance.timeOrigin + performance.now();

export function trace(id: string, stage: string, at: number = traceNow(), batch?: number): void {
  pending.push(batch === undefined ? `${id} ${stage} ${at.toFixed(3)}\n` : `${id} ${stage} ${at.toFixed(3)} ${batch}\n`);
}

/** One stage for every request of a batch, with its size. */
export function traceBatch(ids: readonly string[], stage: string): void {
  const at = traceNow();
  for (const id of ids) trace(id, stage, at, ids.length);
}

if (PREFIX !== null) {
  const file = `${PREFIX}.${process.pid}`;
  const out = fs.createWriteStream(file, { flags: 'a' });
  const flush = () => {
    if (pending.length === 0) return;
    out.write(pending.join(''));
    pending = [];
  };
  setInterval(flush, FLUSH_MS).unref();
  process.on('exit', () => {
    if (pending.length > 0) fs.appendFileSync(file, pending.join(''));
    pending = [];
  });
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      if (e.duration >= GC_MS) pending.push(`- gc ${(performance.timeOrigin + e.startTime).toFixed(3)} ${e.duration.toFixed(3)}\n`);
    }
  }).observe({ entryTypes: ['gc'] });
  let last = performance.now();
  setInterval(() => {
    const now = performance.now();
    const late = now - last - STALL_TICK_MS;
    if (late >= STALL_MS) pending.push(`- stall ${(performance.timeOrigin + last + STALL_TICK_MS).toFixed(3)} ${late.toFixed(3)}\n`);
    last = now;
  }, STALL_TICK_MS).unref();
}

/** Runs a group commit's flush with a stage for every request of the batch as it starts (`<name>_flush`) and once it committed (`<name>_commit`). */
export async function traceFlush<T>(ids: readonly string[], name: string, flush: () => Promise<T>): Promise<T> {
  traceBatch(ids, `${name}_flush`);
  const result = await flush();
  traceBatch(ids, `${name}_commit`);
  return result;
}
