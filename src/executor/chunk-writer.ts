// The per-process chunk writer (DESIGN.md "Chunks"): frames from every live stream are
// group-committed, one multi-row insert per flush, flushing at once when idle and batching
// whatever arrives while a flush is in flight. A frame is visible to readers only after its
// flush commits; the same-process bus delivery then wakes local readers without a round trip.
import type { Pool } from '../db/pool.ts';
import type { Bus } from '../bus/bus.ts';
import { storeFrames, type FrameRow, type ChunkRow } from '../db/requests.ts';
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
      announceFlush(bus, batch);
      try {
        const stored = await retryOnConnectionLoss(() => storeFrames(pool, batch));
        for (const p of batch) p.done(stored.has(p.requestId));
        publishCommitted(bus, batch, stored);
      } catch (err) {
        for (const p of batch) p.fail(err);
        publishCommitted(bus, batch, new Map());
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

/**
 * Tells this process's readers a flush is committing their frames, so the NOTIFY echo of it
 * need not send them to the table: the frames follow in memory (`publishCommitted`).
 */
function announceFlush(bus: Bus, batch: readonly FrameRow[]): void {
  const newest = new Map<string, number>();
  for (const f of batch) newest.set(f.requestId, Math.max(newest.get(f.requestId) ?? 0, f.seq));
  for (const [requestId, seq] of newest) bus.publishLocal({ k: `req:${requestId}`, flushing: seq });
}

/**
 * Wakes this process's readers with the committed frames themselves, so they need not read
 * them back (DESIGN.md "Event bus": same-process events are delivered in memory). A request
 * whose batch mixes attempts (a fenced-out zombie beside the live one) announces only its
 * sequence, and its readers read the table; one with nothing stored releases its readers.
 */
function publishCommitted(bus: Bus, batch: readonly FrameRow[], stored: Map<string, number>): void {
  const byRequest = new Map<string, ChunkRow[] | null>();
  const attemptOf = new Map<string, number>();
  for (const f of batch) {
    if (!stored.has(f.requestId)) {
      byRequest.set(f.requestId, null);
      continue;
    }
    const seen = attemptOf.get(f.requestId);
    if (seen === undefined) {
      attemptOf.set(f.requestId, f.attempt);
      byRequest.set(f.requestId, [{ seq: f.seq, attempt: f.attempt, frame: f.frame }]);
    } else if (seen !== f.attempt) byRequest.set(f.requestId, null);
    else byRequest.get(f.requestId)?.push({ seq: f.seq, attempt: f.attempt, frame: f.frame });
  }
  for (const [requestId, frames] of byRequest) {
    const k = `req:${requestId}`;
    const seq = stored.get(requestId);
    if (seq === undefined) bus.publishLocal({ k, released: true });
    else bus.publishLocal(frames ? { k, seq, frames } : { k, seq, local: true });
  }
}
