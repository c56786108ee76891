// The per-process chunk writer (DESIGN.md "Chunks"): frames from every live stream are
// group-committed, one multi-row insert per flush, flushing at once when idle and batching
// whatever arrives while a flush is in flight. A frame is shown to readers only after its
// flush commits: then this process's readers get the frames themselves in memory, and other
// processes' readers the flush's NOTIFY.
import { createBatchPool, retryOnConnectionLoss, type ConnectionConfig } from '../db/pool.ts';
import type { Bus } from '../bus/bus.ts';
import { storeFrames, type FrameRow, type Stored } from '../db/chunks.ts';
import type { ChunkRow } from '../db/requests.ts';
import { createBatcher } from '../core/batcher.ts';

// Bound on one statement's parameters and one flush's memory.
const MAX_BATCH_FRAMES = 20_000;

export type ChunkWriter = {
  /** Resolves true once the frame is committed, false when its attempt was fenced out. */
  write(frame: FrameRow): Promise<boolean>;
  close(): Promise<void>;
};

export function createChunkWriter(conn: ConnectionConfig, bus: Bus, origin: string): ChunkWriter {
  const pool = createBatchPool(conn, 'sarsen-frames');
  const batcher = createBatcher<FrameRow, boolean>(
    async (batch) => {
      const stored = await retryOnConnectionLoss(() => storeFrames(pool, batch, origin));
      publishCommitted(bus, batch, stored);
      return batch.map((f) => stored.get(f.requestId)?.attempt === f.attempt);
    },
    { maxBatch: MAX_BATCH_FRAMES },
  );
  return { write: (frame) => batcher.add(frame), close: () => pool.end() };
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
