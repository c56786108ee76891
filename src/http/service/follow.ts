// Following a stream by request id: stored frames first, then the live tail. Frames are read
// from the database only after their flush committed, so every id a reader saw can be read
// again. Woken by the bus (chunk flushes and terminal writes), after a bus reconnect, and by
// a slow backstop poll.
import type { Deps } from '../../deps.ts';
import { readFrames, readStreamState, frameExists, type RequestStatus, type ChunkRow } from '../../db/requests.ts';
import { isTerminal } from './wait.ts';
import type { BusMessage } from '../../bus/bus.ts';

export type FollowEvent =
  | { type: 'frame'; seq: number; frame: Buffer }
  | { type: 'end'; status: Extract<RequestStatus, 'succeeded' | 'failed'> }
  | { type: 'superseded' }
  | { type: 'idle' };

const PAGE = 500;
const BACKSTOP_POLL_MS = 2_000;
// Frames held in memory for a reader that is behind; past this it reads the table instead.
const MAX_INBOX = 256;

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
  // Whether the record's state may have changed since it was last read: anything but a chunk
  // flush (a terminal write, a retry, a recovery, a bus reconnect, a silent backstop interval).
  let stateNews = true;
  const poke = () => {
    generation++;
    wake?.();
  };
  // The newest sequence a flush announcement has woken us for. The producing process hears each
  // flush twice (in memory and the NOTIFY echo): one wake-up per sequence is enough.
  let announced = after;
  // Committed frames this process's chunk writer handed over in memory, read instead of the table.
  let inbox: ChunkRow[] = [];
  // The newest sequence a flush of this process's chunk writer is committing: its frames will
  // arrive in memory, so the NOTIFY echo of that flush is no reason to read the table.
  let localFlush = 0;
  const onMessage = (msg: BusMessage) => {
    if (typeof msg.flushing === 'number') {
      localFlush = Math.max(localFlush, msg.flushing);
      return;
    }
    if (msg.released === true) {
      // Nothing of that flush was stored; an echo skipped meanwhile may have been someone else's.
      localFlush = 0;
      poke();
      return;
    }
    if (typeof msg.seq === 'number' && msg.s === undefined) {
      if (Array.isArray(msg.frames) || msg.local === true) {
        localFlush = 0;
        if (Array.isArray(msg.frames) && inbox.length < MAX_INBOX) inbox.push(...(msg.frames as ChunkRow[]));
      } else if (msg.seq <= localFlush) return;
      if (msg.seq <= announced) return;
      announced = msg.seq;
    } else stateNews = true;
    poke();
  };
  /** The inbox's frames that continue exactly after `after`, or null when it has none (read the table). */
  const takeInbox = (): ChunkRow[] | null => {
    const fresh = inbox.filter((f) => f.seq > after);
    inbox = [];
    if (fresh.length === 0 || fresh[0]!.seq !== after + 1) return null;
    const run = [fresh[0]!];
    for (let i = 1; i < fresh.length && fresh[i]!.seq === run[run.length - 1]!.seq + 1; i++) run.push(fresh[i]!);
    return run; // frames after a gap are read from the table next time round (see `announced`)
  };
  const onReconnect = () => {
    stateNews = true;
    poke();
  };
  const unsubscribe = deps.bus.subscribe(`req:${requestId}`, onMessage);
  const unReconnect = deps.bus.onReconnect(onReconnect);
  opts.signal.addEventListener('abort', poke);
  const readState = async () => {
    stateNews = false; // before the read: news arriving during it sets it again
    return readStreamState(deps.pool, requestId);
  };
  // Waits for a poke or, at most, until the next idle tick or backstop poll (which re-reads the state).
  const idle = (untilIdleMs: number) =>
    new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        stateNews = true;
        done();
      }, Math.max(0, Math.min(untilIdleMs, BACKSTOP_POLL_MS)));
      function done() {
        clearTimeout(timer);
        wake = null;
        resolve();
      }
      wake = done;
    });
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
      const frames = takeInbox() ?? (await readFrames(deps.pool, requestId, after, PAGE));
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
      // Frames alone are news enough: the state is read again only when something else happened.
      const state = frames.length === 0 || stateNews ? await readState() : undefined;
      if (state === null) return;
      if (state === undefined) {
        // Sleep only when nothing announced is still undelivered (an inbox that stopped short).
        if (generation === seen && announced <= after) await idle(opts.idleMs - (Date.now() - lastNews));
        continue;
      }
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
      await idle(opts.idleMs - quiet);
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
