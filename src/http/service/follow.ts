// Following a stream by request id: stored frames first, then the live tail. Frames are read
// from the database only after their flush committed, so every id a reader saw can be read
// again. Woken by the bus (chunk flushes and terminal writes), after a bus reconnect, and by
// a slow backstop poll.
import type { Deps } from '../../deps.ts';
import { readFrames, readStreamState, frameExists, type RequestStatus } from '../../db/requests.ts';
import { isTerminal } from './wait.ts';

export type FollowEvent =
  | { type: 'frame'; seq: number; frame: Buffer }
  | { type: 'end'; status: Extract<RequestStatus, 'succeeded' | 'failed'> }
  | { type: 'superseded' }
  | { type: 'idle' };

const PAGE = 500;
const BACKSTOP_POLL_MS = 2_000;

/**
 * Yields the frames after `afterSeq`, then live ones, then `end`. Yields `idle` whenever
 * `idleMs` pass without news (callers send keep-alives or check deadlines), and
 * `superseded` when the attempt being followed was discarded (its worker died).
 */
export async function* follow(
  deps: Deps,
  requestId: string,
  opts: { afterSeq: number; idleMs: number; signal: AbortSignal },
): AsyncGenerator<FollowEvent> {
  let after = opts.afterSeq;
  let following: number | null = null; // the attempt whose frames we have delivered
  let generation = 0;
  let wake: (() => void) | null = null;
  const poke = () => {
    generation++;
    wake?.();
  };
  const unsubscribe = deps.bus.subscribe(`req:${requestId}`, poke);
  const unReconnect = deps.bus.onReconnect(poke);
  opts.signal.addEventListener('abort', poke);
  try {
    // A resume point that was handed out but is no longer stored belongs to a discarded
    // attempt (frames are only ever removed that way while the record lives).
    if (after > 0) {
      const initial = await readStreamState(deps.pool, requestId);
      if (initial && after <= initial.seqHigh && !(await frameExists(deps.pool, requestId, after))) {
        yield { type: 'superseded' };
        return;
      }
    }
    let lastNews = Date.now();
    for (;;) {
      if (opts.signal.aborted) return;
      const seen = generation;
      const frames = await readFrames(deps.pool, requestId, after, PAGE);
      for (const f of frames) {
        if (following !== null && f.attempt !== following) {
          yield { type: 'superseded' };
          return;
        }
        following = f.attempt;
        after = f.seq;
        yield { type: 'frame', seq: f.seq, frame: f.frame };
      }
      if (frames.length === PAGE) continue;
      if (frames.length > 0) lastNews = Date.now();
      const state = await readStreamState(deps.pool, requestId);
      if (!state) return;
      // Frames were delivered from an attempt that is no longer the live one: its worker died
      // and the request went back to pending (or another attempt already took it).
      if (following !== null && !isTerminal(state.status) && (state.status === 'pending' || state.attempts !== following)) {
        yield { type: 'superseded' };
        return;
      }
      if (isTerminal(state.status)) {
        // Frames commit before the terminal write: one more read catches the last of them.
        const rest = await readFrames(deps.pool, requestId, after, Number.MAX_SAFE_INTEGER);
        for (const f of rest) {
          after = f.seq;
          yield { type: 'frame', seq: f.seq, frame: f.frame };
        }
        yield { type: 'end', status: state.status as 'succeeded' | 'failed' };
        return;
      }
      if (generation !== seen) continue;
      const quiet = Date.now() - lastNews;
      if (quiet >= opts.idleMs) {
        lastNews = Date.now();
        yield { type: 'idle' };
        continue;
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, Math.min(opts.idleMs - quiet, BACKSTOP_POLL_MS));
        function done() {
          clearTimeout(timer);
          wake = null;
          resolve();
        }
        wake = done;
      });
    }
  } finally {
    unsubscribe();
    unReconnect();
    opts.signal.removeEventListener('abort', poke);
  }
}

/** One SSE event whose data may span lines (each line gets its own `data:`). */
export function sseEvent(event: string, data: string): string {
  return `event: ${event}\n${data.split(/\r\n|\r|\n/).map((l) => `data: ${l}`).join('\n')}\n\n`;
}

export const SUPERSEDED_EVENT = sseEvent(
  'failed',
  JSON.stringify({
    status: 'superseded',
    detail: 'The worker producing this stream died and another took the request over; the earlier frames were discarded. Re-open the stream by request id to read the new attempt from its beginning.',
  }),
);
