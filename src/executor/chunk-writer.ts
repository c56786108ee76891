// The per-process chunk writer (DESIGN.md "Chunks"): frames from every live stream are
// group-committed, one multi-row insert per flush, flushing at once when idle and batching
// whatever arrives while a flush is in flight. A frame is visible to readers only after its
// flush commits; the same-process bus delivery then wakes local readers without a round trip.
import type { Pool } from '../db/pool.ts';
import type { Bus } from '../bus/bus.ts';
import { storeFrames, type FrameRow } from '../db/requests.ts';
import { retryOnConnectionLoss } from '../db/pool.ts';

// Bound on one statement's parameters and one flush's memory.
const MAX_BATCH_FRAMES = 2000;

type Pending = FrameRow & { done: (stored: boolean) => void; fail: (err: unknown) => void };

export type ChunkWriter = {
  /** Resolves true once the frame is committed, false when its attempt was fenced out. */
  write(frame: FrameRow): Promise<boolean>;
};

export function createChunkWriter(pool: Pool, bus: Bus): ChunkWriter {
  let queue: Pending[] = [];
  let flushing = false;

  const flush = async (): Promise<void> => {
    flushing = true;
    while (queue.length > 0) {
      const batch = queue.slice(0, MAX_BATCH_FRAMES);
      queue = queue.slice(batch.length);
      try {
        const stored = await retryOnConnectionLoss(() => storeFrames(pool, batch));
        for (const p of batch) p.done(stored.has(p.requestId));
        for (const [requestId, seq] of stored) bus.publishLocal({ k: `req:${requestId}`, seq });
      } catch (err) {
        for (const p of batch) p.fail(err);
      }
    }
    flushing = false;
  };

  return {
    write(frame) {
      return new Promise<boolean>((done, fail) => {
        queue.push({ ...frame, done, fail });
        // Frames pushed in the same tick (one network read) share the first flush.
        if (!flushing) {
          flushing = true;
          setImmediate(() => void flush());
        }
      });
    },
  };
}
