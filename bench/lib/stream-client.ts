// The streaming benchmark's caller: one streaming POST, the arrival time of every frame (a
// frame ends at a blank line; the benchmark provider's frames hold no other line breaks), and
// what the answer was. Bounded by a deadline so a stuck stream cannot stall the run.
import http from 'node:http';
import { performance } from 'node:perf_hooks';

export type StreamResult = {
  tag: string;
  status: number;
  /** performance.now() when the request was sent. */
  startedAt: number;
  /** performance.now() at which each frame was complete at the caller. */
  arrivals: number[];
  ok: boolean;
  error?: string;
};

export function createAgent(): http.Agent {
  return new http.Agent({ keepAlive: true, maxSockets: Infinity, maxFreeSockets: 2048 });
}

export function streamOnce(
  agent: http.Agent,
  url: string,
  opts: { tag: string; body: string; headers?: Record<string, string>; expectFrames: number; timeoutMs: number; signal?: AbortSignal },
): Promise<StreamResult> {
  return new Promise((resolve) => {
    const arrivals: number[] = [];
    let status = 0;
    let settled = false;
    const startedAt = performance.now();
    const done = (ok: boolean, error?: string) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      resolve({ tag: opts.tag, status, startedAt, arrivals, ok, ...(error ? { error } : {}) });
    };
    const req = http.request(
      url,
      {
        method: 'POST',
        agent,
        headers: { 'content-type': 'application/json', accept: 'text/event-stream', 'content-length': String(Buffer.byteLength(opts.body)), ...opts.headers },
      },
      (res) => {
        status = res.statusCode ?? 0;
        let tail = ''; // the unfinished frame's last byte, enough to see a blank line across reads
        res.setEncoding('latin1');
        res.on('data', (chunk: string) => {
          const now = performance.now();
          const text = tail + chunk;
          let from = 0;
          for (;;) {
            const at = text.indexOf('\n\n', from);
            if (at === -1) break;
            arrivals.push(now);
            from = at + 2;
          }
          tail = text.slice(Math.max(from, text.length - 1));
        });
        res.on('end', () => {
          const ok = status === 200 && arrivals.length === opts.expectFrames;
          done(ok, ok ? undefined : `status ${status}, ${arrivals.length} of ${opts.expectFrames} frames`);
        });
        res.on('error', (err) => done(false, err.message));
      },
    );
    const timer = setTimeout(() => {
      req.destroy();
      done(false, `timed out after ${opts.timeoutMs} ms with ${arrivals.length} frames`);
    }, opts.timeoutMs);
    const onAbort = () => {
      req.destroy();
      done(false, 'aborted');
    };
    req.on('error', (err) => done(false, err.message));
    if (opts.signal?.aborted) return onAbort();
    opts.signal?.addEventListener('abort', onAbort);
    req.end(opts.body);
  });
}

/** Runs `total` streams with at most `concurrency` in flight; answers them in start order. */
export async function closedLoop<T>(total: number, concurrency: number, run: (n: number) => Promise<T>): Promise<T[]> {
  const results: T[] = new Array(total);
  let next = 0;
  const worker = async () => {
    for (;;) {
      const n = next++;
      if (n >= total) return;
      results[n] = await run(n);
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, total) }, worker));
  return results;
}
