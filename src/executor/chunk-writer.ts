// The per-process chunk writer (docs/durability.md "Group commits" and "Stream frames"): frames
// from every live stream are group-committed, one multi-row insert per flush, flushing at once
// when idle and batching whatever arrives while a flush is in flight. A frame is shown to readers
// only after its flush commits: then this process's readers get the frames themselves in memory,
// and other processes' readers the flush's NOTIFY.
import { createBatchPool, retryTransient, type ConnectionConfig } from '../db/pool.ts';
import type { Bus } from '../bus/bus.ts';
import { storeFrames, type FrameRow, type Stored } from '../db/chunks.ts';
import type { ChunkRow } from '../db/requests.ts';
import { createBatcher } from '../core/batcher.ts';
import { observeFlush } from '../metrics/metrics.ts';

// Bound on one statement's parameters and one flush's memory (writes of a network read each).
const MAX_BATCH_WRITES = 10_000;

export type ChunkWriter = {
  /**
   * Stores consecutive frames of one attempt (what one read from the provider completed).
   * Resolves true once they are committed, false when their attempt was fenced out.
   */
  write(frames: readonly FrameRow[]): Promise<boolean>;
  close(): Promise<void>;
};

/** `retryForMs`: how long a flush is retried through a database outage (its frames wait in memory). */
export function createChunkWriter(conn: ConnectionConfig, bus: Bus, origin: string, retryForMs: () => number): ChunkWriter {
  const pool = createBatchPool(conn, 'sarsen-frames');
  const batcher = createBatcher<readonly FrameRow[], boolean>(
    async (writes) => {
      const batch = writes.flat();
      const started = performance.now();
      const stored = await retryTransient(() => storeFrames(pool, batch, origin), retryForMs());
      const results = writes.map((w) => stored.get(w[0]!.requestId)?.attempt === w[0]!.attempt);
      observeFlush(batch.length, writes.reduce((n, w, i) => (results[i] ? n + w.length : n), 0), started);
      publishCommitted(bus, batch, stored);
      return results;
    },
    { maxBatch: MAX_BATCH_WRITES },
  );
  return { write: (frames) => batcher.add(frames), close: () => pool.end() };
}

/**
 * Hands this process's readers the committed frames, per request (only the attempt that held
 * the request had its frames stored; a zombie's beside it were fenced out). A request with
 * nothing stored was fenced out entirely, and its readers learn of that from the recovery's
 * own event.
 */
function publishCommitted(bus: Bus, batch: readonly FrameRow[], stored: Stored): void {
  const byRequest = new Map<string, ChunkRow[]>();
  for (const f of batch) {
    if (stored.get(f.requestId)?.attempt !== f.attempt) continue;
    let frames = byRequest.get(f.requestId);
    if (!frames) byRequest.set(f.requestId, (frames = []));
    frames.push({ seq: f.seq, attempt: f.attempt, frame: f.frame });
  }
  for (const [requestId, frames] of byRequest) bus.publishRequest({ type: 'frames', requestId, seq: stored.get(requestId)!.seq, frames });
}
