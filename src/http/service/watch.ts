// Watching one request: its frames after a point (stored ones, then live), then its terminal
// answer. The synchronous, streaming and replay routes all read a request through this.
//
// What this process produced arrives in memory: committed frames from its chunk writer, the
// answer from its terminal write. The database is read only for what happened elsewhere (a
// NOTIFY names it), for what was stored before the watch began, after a bus reconnect (NOTIFY
// is not replayed), and on a slow backstop poll. Frames are only ever delivered after their
// flush committed, so every id a reader saw can be read again.
import type { BaseDeps } from '../../deps.ts';
import type { RequestEvent } from '../../db/events.ts';
import { readAnswer as readStoredAnswer, readStreamState, isTerminal, type StoredAnswer, type ChunkRow } from '../../db/requests.ts';
import { readFrames, frameExists } from '../../db/chunks.ts';
import { retryTransient } from '../../db/pool.ts';

export type WatchEvent =
  /** Frames in order, numbered consecutively (as many as were at hand). */
  | { type: 'frames'; frames: readonly ChunkRow[] }
  /** The request settled; `answer` is what it stored. */
  | { type: 'end'; answer: StoredAnswer }
  /** The attempt whose frames were delivered was discarded (its worker died, another took over). */
  | { type: 'superseded' }
  /** `idleMs` passed without news (callers send keep-alives or check deadlines). */
  | { type: 'idle' };

export type Watched = Readonly<{ id: string; namespaceId: string; streaming: boolean }>;

export type WatchOptions = {
  /** Deliver frames after this sequence number (0: from the first). */
  afterSeq: number;
  idleMs: number;
  signal: AbortSignal;
  /** The request was just accepted and is not settled: nothing stored needs reading yet. */
  fresh?: boolean;
};

// One read of stored frames: rows (each the frames of one flush, at most 64 KiB) and bytes.
// A reader holds about one page, whatever the stream's length; the next page is read only
// once the caller's socket took the last one (the routes wait for 'drain').
const PAGE = { rows: 100, maxBytes: 64 * 1024 };
const BACKSTOP_POLL_MS = 2_000;
// Frames held in memory for a reader that is behind; past this it reads the table instead.
const MAX_INBOX = 256;
const MAX_INBOX_BYTES = 256 * 1024;

export async function* watch(deps: BaseDeps, r: Watched, opts: WatchOptions): AsyncGenerator<WatchEvent> {
  let after = opts.afterSeq;
  let following: number | null = null; // the attempt whose frames were delivered
  // What is known but not yet delivered: frames handed over in memory, the newest committed
  // sequence announced, the answer handed over in memory.
  let inbox: ChunkRow[] = [];
  let inboxBytes = 0;
  let announced = after;
  let answer: StoredAnswer | null = null;
  // Whether the database must be read: the stored frames, and the state (it changed somewhere
  // else, or the bus reconnected, or the backstop interval passed).
  let readTable = !opts.fresh;
  let stateNews = !opts.fresh;
  let generation = 0;
  let wake: (() => void) | null = null;
  let lastPoke = Date.now();
  const poke = () => {
    lastPoke = Date.now();
    generation++;
    wake?.();
  };
  const onEvent = (ev: RequestEvent) => {
    if (ev.type === 'frames') {
      if (ev.frames && inbox.length < MAX_INBOX && inboxBytes < MAX_INBOX_BYTES) {
        inbox.push(...ev.frames);
        for (const f of ev.frames) inboxBytes += f.frame.length;
      }
      announced = Math.max(announced, ev.seq);
    } else if (ev.type === 'state' && ev.answer) answer = ev.answer;
    else stateNews = true;
    poke();
  };
  const onReconnect = () => {
    readTable = stateNews = true;
    poke();
  };
  // Reads ride out a database outage (the caller stays held) until they succeed or the caller leaves.
  const db = <T>(read: () => Promise<T>): Promise<T> => retryTransient(read, Infinity, { signal: opts.signal, onReturn: onReconnect });
  /** The inbox's frames that continue exactly after `after`, or null when it has none (read the table). */
  const takeInbox = (): ChunkRow[] | null => {
    const held = inbox;
    inbox = [];
    inboxBytes = 0;
    let from = 0;
    while (from < held.length && held[from]!.seq <= after) from++;
    if (from === held.length || held[from]!.seq !== after + 1) return null;
    let to = from + 1;
    while (to < held.length && held[to]!.seq === held[to - 1]!.seq + 1) to++;
    return from === 0 && to === held.length ? held : held.slice(from, to); // after a gap: the table, next time round
  };
  const nextFrames = async (): Promise<ChunkRow[]> => {
    if (!r.streaming) {
      readTable = false; // a request that was not streamed has no frames
      return [];
    }
    const run = takeInbox();
    if (run) return run;
    if (!readTable && announced <= after) return [];
    const before = announced;
    const { frames, more } = await db(() => readFrames(deps.pool, r.id, after, PAGE));
    readTable = more; // a full page: there may be more
    // Otherwise the table has all there is: what was announced and is missing was discarded
    // (its attempt was superseded, which the state read tells).
    if (!readTable && announced === before) announced = Math.min(announced, frames.at(-1)?.seq ?? after);
    return frames;
  };
  // One timer per watch, armed for the earliest wake-up needed and not re-armed for later ones
  // (a live stream pokes the watch every frame; a timer per wait would cost more than the
  // frame). When it fires after a quiet backstop interval, the database is read again.
  let timer: NodeJS.Timeout | undefined;
  let timerAt = Infinity;
  const onTimer = () => {
    timer = undefined;
    timerAt = Infinity;
    if (Date.now() - lastPoke >= BACKSTOP_POLL_MS) readTable = stateNews = true;
    generation++;
    wake?.();
  };
  // Waits for a poke or, at most, until the next idle tick or backstop poll.
  const sleep = (untilIdleMs: number) =>
    new Promise<void>((resolve) => {
      wake = () => {
        wake = null;
        resolve();
      };
      const at = Date.now() + Math.max(0, Math.min(untilIdleMs, BACKSTOP_POLL_MS));
      if (at < timerAt) {
        clearTimeout(timer);
        timerAt = at;
        timer = setTimeout(onTimer, at - Date.now());
      }
    });

  const unsubscribe = deps.bus.onRequest(r.id, onEvent);
  const unReconnect = deps.bus.onReconnect(onReconnect);
  opts.signal.addEventListener('abort', poke);
  try {
    // A resume point that was handed out but is no longer stored belongs to a discarded
    // attempt (frames are only ever removed that way while the record lives).
    if (after > 0) {
      const initial = await db(() => readStreamState(deps.pool, r.id));
      if (initial && after <= initial.seqHigh && !(await db(() => frameExists(deps.pool, r.id, after)))) {
        yield { type: 'superseded' };
        return;
      }
    }
    let lastNews = Date.now();
    for (;;) {
      if (opts.signal.aborted) return;
      const seen = generation;
      const frames = await nextFrames();
      // A frame of another attempt than the one being followed: that one was discarded.
      const attempt: number | undefined = following ?? frames[0]?.attempt;
      const cut = frames.findIndex((f) => f.attempt !== attempt);
      const deliver = cut === -1 ? frames : frames.slice(0, cut);
      if (deliver.length > 0) {
        following = attempt!;
        after = deliver[deliver.length - 1]!.seq;
        lastNews = Date.now();
        yield { type: 'frames', frames: deliver };
      }
      if (cut !== -1) {
        yield { type: 'superseded' };
        return;
      }

      if (!answer && stateNews) {
        stateNews = false; // before the read: news arriving during it sets it again
        if (r.streaming) {
          const state = await db(() => readStreamState(deps.pool, r.id));
          if (state === null) return;
          // Frames were delivered from an attempt that is no longer the live one: its worker
          // died and the request went back to pending (or another attempt already took it).
          if (following !== null && !isTerminal(state.status) && (state.status === 'pending' || state.attempts !== following)) {
            yield { type: 'superseded' };
            return;
          }
          if (isTerminal(state.status)) answer = await db(() => readAnswer(deps, r));
        } else {
          answer = await db(() => readAnswer(deps, r));
        }
        // Frames commit before the terminal write: those not yet delivered are in the table.
        if (answer) readTable = true;
      }
      if (answer) {
        for (let rest = await nextFrames(); rest.length > 0; rest = await nextFrames()) {
          after = rest[rest.length - 1]!.seq;
          yield { type: 'frames', frames: rest };
          if (opts.signal.aborted) return;
        }
        yield { type: 'end', answer };
        return;
      }
      // Read on after a full page, or when frames were announced that the inbox did not hold.
      if (readTable || announced > after || generation !== seen) continue;
      const quiet = Date.now() - lastNews;
      if (quiet >= opts.idleMs) {
        lastNews = Date.now();
        yield { type: 'idle' };
        continue;
      }
      await sleep(opts.idleMs - quiet);
    }
  } finally {
    clearTimeout(timer);
    unsubscribe();
    unReconnect();
    opts.signal.removeEventListener('abort', poke);
  }
}

/** The stored answer; null while the request has not settled. */
async function readAnswer(deps: BaseDeps, r: Watched): Promise<StoredAnswer | null> {
  const answer = await readStoredAnswer(deps.pool, r.namespaceId, r.id);
  if (answer === undefined) throw new Error(`request ${r.id} vanished while watched`);
  return answer;
}
