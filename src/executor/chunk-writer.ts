// The per-process chunk writer (DESIGN.md "Chunks"): frames from every live stream are
// group-committed, one multi-row insert per flush, flushing at once when idle and batching
// whatever arrives while a flush is in flight. A frame is shown to readers only after its
// flush commits: then this process's readers get the frames themselves in memory, and other
// processes' readers the flush's NOTIFY.
import type { Pool } from '../db/pool.ts';
import { retryOnConnectionLoss } from '../db/pool.ts';
import type { Bus } from '../bus/bus.ts';
import { storeFrames, type FrameRow } from '../db/chunks.ts';
import type { ChunkRow } from '../db/requests.ts';
import { createBatcher } from '../core/batcher.ts';

// Bound on one statement's parameters and one flush's memory.
const MAX_BATCH_FRAMES = 2000;

export type ChunkWriter = {
  /** Resolves true once the frame is committed, false when its attempt was fenced out. */
  write(frame: FrameRow): Promise<boolean>;
};

export function createChunkWriter(pool: Pool, bus: Bus, origin: string): ChunkWriter {
  const batcher = createBatcher<FrameRow, boolean>(
    async (batch) => {
      const stored = await retryOnConnectionLoss(() => storeFrames(pool, batch, origin));
      publishCommitted(bus, batch, stored);
      return batch.map((f) => stored.has(f.requestId));
    },
    { maxBatch: MAX_BATCH_FRAMES },
  );
  return { write: (frame) => batcher.add(frame) };
}

/**
 * Hands this process's readers the committed frames, per request. A request whose batch mixes
 * attempts (a fenced-out zombie beside the live one) gets only its newest sequence, and its
 * readers read the table; one with nothing stored was fenced out, and its readers learn of
 * that from the recovery's own event.
 */
function publishCommitted(bus: Bus, batch: readonly FrameRow[], stored: Map<string, number>): void {
  const byRequest = new Map<string, ChunkRow[] | null>();
  for (const f of batch) {
    if (!stored.has(f.requestId)) continue;
    const frames = byRequest.get(f.requestId);
    if (frames === undefined) byRequest.set(f.requestId, [{ seq: f.seq, attempt: f.attempt, frame: f.frame }]);
    else if (frames !== null && frames[0]!.attempt !== f.attempt) byRequest.set(f.requestId, null);
    else frames?.push({ seq: f.seq, attempt: f.attempt, frame: f.frame });
  }
  for (const [requestId, frames] of byRequest) {
    const seq = stored.get(requestId)!;
    bus.publishRequest(frames ? { type: 'frames', requestId, seq, frames } : { type: 'frames', requestId, seq });
  }
}
