// A closed-loop load generator: C workers, each sending its next request as soon as the
// previous one is answered, over an undici Pool with one connection per worker. A warm-up
// runs first and is not measured; then a fixed window in which every completed request counts
// towards throughput and every request that both started and finished in it gives a latency.
import { Pool } from 'undici';
import { performance } from 'node:perf_hooks';

export type LoadRequest = { method?: string; path: string; headers: Record<string, string>; body?: string };

export type LoadOptions = {
  /** `http://127.0.0.1:port`: never anything but loopback. */
  origin: string;
  concurrency: number;
  warmupMs: number;
  durationMs: number;
  /** The n-th request (n counts from 1 across all workers, warm-up included). */
  next(n: number): LoadRequest;
  /** The status every answer should have. */
  expect: number;
  /** Called once when the measured window opens (after the warm-up). */
  onMeasureStart?(): void;
  /** Ends the run early (the workers stop after their request in flight). */
  signal?: AbortSignal;
  /** Bounds a single request, so a stuck server cannot stall the run. */
  requestTimeoutMs?: number;
};

export type LoadResult = {
  concurrency: number;
  /** Length of the measured window in ms. */
  windowMs: number;
  /** Requests that finished inside the window with the expected status. */
  completed: number;
  /** completed per second. */
  rate: number;
  /** ms, for requests that started and finished inside the window with the expected status. */
  latencies: Float64Array;
  /** Unexpected answers over the whole run, warm-up included: status (or error code) -> count. */
  unexpected: Map<string, number>;
  /** Requests sent over the whole run, warm-up included. */
  sent: number;
};

export function assertLoopback(origin: string): void {
  const host = new URL(origin).hostname;
  if (host !== '127.0.0.1' && host !== 'localhost' && host !== '[::1]') {
    throw new Error(`benchmarks only send traffic to 127.0.0.1, not ${origin}`);
  }
}

export async function runLoad(o: LoadOptions): Promise<LoadResult> {
  assertLoopback(o.origin);
  const timeout = o.requestTimeoutMs ?? 30_000;
  const pool = new Pool(o.origin, {
    connections: o.concurrency,
    pipelining: 1,
    keepAliveTimeout: 60_000,
    headersTimeout: timeout,
    bodyTimeout: timeout,
  });
  const latencies: number[] = [];
  const unexpected = new Map<string, number>();
  const note = (what: string) => unexpected.set(what, (unexpected.get(what) ?? 0) + 1);
  let n = 0;
  let completed = 0;
  const t0 = performance.now();
  const start = t0 + o.warmupMs;
  const end = start + o.durationMs;
  let opened = false;

  const worker = async () => {
    for (;;) {
      const now = performance.now();
      if (now >= end || o.signal?.aborted) return;
      if (!opened && now >= start) {
        opened = true;
        o.onMeasureStart?.();
      }
      const r = o.next(++n);
      const sentAt = performance.now();
      let status: string;
      try {
        const res = await pool.request({ method: (r.method ?? 'POST') as 'POST', path: r.path, headers: r.headers, body: r.body });
        await res.body.arrayBuffer();
        status = String(res.statusCode);
      } catch (err) {
        status = `error ${(err as { code?: string }).code ?? (err as Error).message}`;
        await new Promise((resolve) => setTimeout(resolve, 5)); // no tight loop against a dead server
      }
      const doneAt = performance.now();
      if (status !== String(o.expect)) {
        note(status);
        continue;
      }
      if (doneAt >= start && doneAt <= end) {
        completed++;
        if (sentAt >= start) latencies.push(doneAt - sentAt);
      }
    }
  };

  try {
    await Promise.all(Array.from({ length: o.concurrency }, worker));
  } finally {
    await pool.close();
  }
  return {
    concurrency: o.concurrency,
    windowMs: o.durationMs,
    completed,
    rate: (completed * 1000) / o.durationMs,
    latencies: Float64Array.from(latencies),
    unexpected,
    sent: n,
  };
}

/** "none", or "503×3, error ECONNRESET×1". */
export function describeUnexpected(m: Map<string, number>): string {
  if (m.size === 0) return 'none';
  return [...m].map(([k, v]) => `${k}×${v}`).join(', ');
}
