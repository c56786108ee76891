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
import { readAnswer, readStreamState, isTerminal, type StoredAnswer, type ChunkRow } from '../../db/requests.ts';
import { readFrames, frameExists } from '../../db/chunks.ts';
import { retryTransient } from '../../db/pool.ts';
import { createFrameInbox } from '../../core/frame-inbox.ts';
import { createWakeTimer } from '../../core/wake-timer.ts';

export type WatchEvent =
  /**
   * Frames in order, numbered consecutively (as many as were at hand). `page`: read from the
   * table, up to a page of them; the caller sends a page before it asks for the next.
   */
  | { type: 'frames'; frames: readonly ChunkRow[]; page: boolean }
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
const INBOX_BOUNDS = { frames: 256, bytes: 256 * 1024 };

const SUPERSEDED: WatchEvent = { type: 'superseded' };
const IDLE: WatchEvent = { type: 'idle' };
type Frames = Extract<WatchEvent, { type: 'frames' }>;
// A turn with nothing to deliver (never delivered, so never emptied by a caller).
const NO_FRAMES: Frames = { type: 'frames', frames: [], page: false };

/**
 * What a watch is doing; each mode is one method, which does that mode's work and chooses the
 * next. It starts `resuming` when given a resume point, `following` otherwise.
 * - resuming: checking that the resume point is still stored (one that is not belongs to a
 *   discarded attempt: frames are removed only that way while the record lives).
 * - following: delivering the frames at hand (from the inbox, or from the table when something
 *   says it holds more), up to any of another attempt than the one followed.
 * - checking: deciding from what the turn learnt: the request's state is read when news says
 *   it changed; then settle, read on, deliver an idle tick, or wait.
 * - waiting: nothing known to deliver; asleep until news, the next idle tick or the backstop poll.
 * - settling: the answer is known; delivering the frames not yet delivered (they committed before
 *   the answer, so the table has them), then the answer.
 * - superseded: the attempt whose frames were delivered was discarded; delivering that says so.
 * - ended: the answer or `superseded` was delivered, the caller left, or the record vanished.
 */
export type Mode = 'resuming' | 'following' | 'checking' | 'waiting' | 'settling' | 'superseded' | 'ended';

const NEXT: Readonly<Record<Mode, readonly Mode[]>> = {
  resuming: ['following', 'superseded'],
  following: ['checking', 'superseded', 'ended'],
  checking: ['following', 'waiting', 'settling', 'superseded', 'ended'],
  waiting: ['following'],
  settling: ['ended'],
  superseded: ['ended'],
  ended: [],
};

/**
 * What one step delivers (null: nothing). A step that needs no I/O answers at once: it is not
 * awaited, since an await costs a promise and a live stream takes a few steps per frame.
 */
type Step = WatchEvent | null | Promise<WatchEvent | null>;

export function watch(deps: BaseDeps, request: Watched, opts: WatchOptions): AsyncGenerator<WatchEvent> {
  return new Watch(deps, request, opts).events();
}

export class Watch {
  private readonly deps: BaseDeps;
  private readonly request: Watched;
  private readonly opts: WatchOptions;
  private current: Mode;
  /** The last sequence number delivered. */
  private after: number;
  /** The last frame delivered: the next page's first frame may be stored as its difference from this one (readFrames). */
  private last: ChunkRow | null = null;
  /** The attempt whose frames were delivered (null before the first). */
  private following: number | null = null;
  /** The newest sequence number known to be committed (announced by an event, or seen in the table). */
  private announced: number;
  /** The answer, once known (handed over in memory, or read). */
  private answer: StoredAnswer | null = null;
  /** The table may hold frames the inbox does not: it was never read, a page came back full, the bus reconnected, or the backstop poll. */
  private readTable: boolean;
  /** The request's state may have changed unseen: news from elsewhere, the bus reconnected, or the backstop poll. */
  private readState: boolean;
  /** Something was heard since this turn began: a turn that heard news does not sleep. */
  private heardNews = false;
  /** When frames or an idle tick were last delivered: the idle tick counts from here. */
  private deliveredAt = 0;
  /** Ends the current wait (set while waiting). */
  private wake: (() => void) | null = null;
  private readonly inbox = createFrameInbox<ChunkRow>(INBOX_BOUNDS);
  private readonly timer = createWakeTimer(BACKSTOP_POLL_MS, (backstopDue) => {
    if (backstopDue) this.readTable = this.readState = true;
    this.heardNews = true;
    this.wake?.();
  });

  constructor(deps: BaseDeps, request: Watched, opts: WatchOptions) {
    this.deps = deps;
    this.request = request;
    this.opts = opts;
    this.current = opts.afterSeq > 0 ? 'resuming' : 'following';
    this.after = this.announced = opts.afterSeq;
    this.readTable = this.readState = !opts.fresh;
  }

  get mode(): Mode {
    return this.current;
  }

  async *events(): AsyncGenerator<WatchEvent> {
    const unsubscribe = this.deps.bus.onRequest(this.request.id, this.onEvent);
    const unReconnect = this.deps.bus.onReconnect(this.onReconnect);
    this.opts.signal.addEventListener('abort', this.poke);
    try {
      this.deliveredAt = Date.now();
      while (this.current !== 'ended') {
        const step = this.step();
        const event = step instanceof Promise ? await step : step;
        // The event is the only holder of its frames, and the caller empties it once it sent them:
        // a generator keeps its variables across a yield, and a page kept through the next read
        // outlives the young generation.
        if (event !== null) yield event;
      }
    } finally {
      this.timer.stop();
      unsubscribe();
      unReconnect();
      this.opts.signal.removeEventListener('abort', this.poke);
    }
  }

  private step(): Step {
    switch (this.current) {
      case 'resuming':
        return this.resume();
      case 'following':
        return this.follow();
      case 'checking':
        return this.check();
      case 'waiting':
        return this.wait();
      case 'settling':
        return this.settle();
      case 'superseded':
        return this.supersede();
      case 'ended':
        return null;
    }
  }

  /** resuming → following, or → superseded when the resume point was handed out and is no longer stored. */
  private async resume(): Promise<null> {
    const { pool } = this.deps;
    const { id } = this.request;
    const state = await this.db(() => readStreamState(pool, id));
    const discarded = state !== null && this.after <= state.seqHigh && !(await this.db(() => frameExists(pool, id, this.after)));
    this.deliveredAt = Date.now();
    this.enter(discarded ? 'superseded' : 'following');
    return null;
  }

  /** following → checking with the frames at hand, → superseded when they run into another attempt's, → ended when the caller left. */
  private follow(): Step {
    if (this.opts.signal.aborted) return this.end();
    this.heardNews = false;
    const frames = this.takeFrames();
    return frames instanceof Promise ? frames.then(this.deliver) : this.deliver(frames);
  }

  private readonly deliver = (event: Frames): Frames | null => {
    // A frame of another attempt than the one followed: that one was discarded.
    const attempt: number | undefined = this.following ?? event.frames[0]?.attempt;
    const cut = event.frames.findIndex((f) => f.attempt !== attempt);
    if (cut !== -1) event.frames = event.frames.slice(0, cut);
    this.enter(cut === -1 ? 'checking' : 'superseded');
    if (event.frames.length === 0) return null;
    this.following = attempt!;
    this.delivered(event);
    this.deliveredAt = Date.now();
    return event;
  };

  /**
   * checking: the state is read first when news says it changed (→ superseded, or → ended when
   * the record vanished); then the answer known → settling; more to read or news heard →
   * following; quiet for `idleMs` → following after an idle tick; else → waiting.
   */
  private check(): Step {
    if (this.readState && !this.answer) return this.checkState().then(this.decide);
    return this.decide('seen');
  }

  private readonly decide = (state: 'superseded' | 'vanished' | 'seen'): WatchEvent | null => {
    if (state === 'vanished') return this.end();
    if (state === 'superseded' || this.answer) {
      this.enter(state === 'superseded' ? 'superseded' : 'settling');
      return null;
    }
    // Read on after a full page, or when frames were announced that the inbox did not hold.
    if (this.readTable || this.announced > this.after || this.heardNews) {
      this.enter('following');
      return null;
    }
    if (Date.now() - this.deliveredAt < this.opts.idleMs) {
      this.enter('waiting');
      return null;
    }
    this.deliveredAt = Date.now();
    this.enter('following');
    return IDLE;
  };

  /** waiting → following at news, the next idle tick or the backstop poll. */
  private wait(): Promise<null> {
    return new Promise<null>((resolve) => {
      this.wake = () => {
        this.wake = null;
        this.enter('following');
        resolve(null);
      };
      // News heard since this turn began (while its state was read) ends the wait at once.
      if (this.heardNews) this.wake();
      else this.timer.wakeWithin(this.opts.idleMs - (Date.now() - this.deliveredAt));
    });
  }

  /** settling → ended once the frames not yet delivered were, with the answer; or when the caller left. */
  private settle(): Step {
    if (this.opts.signal.aborted) return this.end();
    const frames = this.takeFrames();
    return frames instanceof Promise ? frames.then(this.settled) : this.settled(frames);
  }

  private readonly settled = (event: Frames): WatchEvent => {
    if (event.frames.length > 0) {
      this.delivered(event);
      return event;
    }
    this.enter('ended');
    return { type: 'end', answer: this.answer! };
  };

  /** superseded → ended: the one place a watch says the attempt it followed was discarded. */
  private supersede(): WatchEvent {
    this.enter('ended');
    return SUPERSEDED;
  }

  private end(): null {
    this.enter('ended');
    return null;
  }

  /** Every change of mode passes here, so a transition the design does not have fails loudly. */
  private enter(next: Mode): void {
    if (!NEXT[this.current].includes(next)) throw new Error(`a watch of request ${this.request.id} went from ${this.current} to ${next}`);
    this.current = next;
  }

  private readonly poke = (): void => {
    this.timer.heard();
    this.heardNews = true;
    this.wake?.();
  };

  private readonly onEvent = (ev: RequestEvent): void => {
    if (ev.type === 'frames') {
      if (ev.frames) this.inbox.add(ev.frames);
      this.announced = Math.max(this.announced, ev.seq);
    } else if (ev.type === 'state' && ev.answer) this.answer = ev.answer;
    else this.readState = true;
    this.poke();
  };

  private readonly onReconnect = (): void => {
    this.readTable = this.readState = true;
    this.poke();
  };

  /** A read that rides out a database outage (the caller stays held) until it succeeds or the caller leaves. */
  private db<T>(read: () => Promise<T>): Promise<T> {
    return retryTransient(read, Infinity, { signal: this.opts.signal, onReturn: this.onReconnect });
  }

  /**
   * The frames to deliver next: the inbox's run after the last delivered, else the table's when
   * it may hold more (the only case that waits for I/O).
   */
  private takeFrames(): Frames | Promise<Frames> {
    if (!this.request.streaming) {
      this.readTable = false; // a request that was not streamed has no frames
      return NO_FRAMES;
    }
    const run = this.inbox.takeAfter(this.after);
    if (run) return { type: 'frames', frames: run, page: false };
    if (!this.readTable && this.announced <= this.after) return NO_FRAMES;
    return this.readPage();
  }

  private delivered({ frames, page }: Frames): void {
    const last = frames[frames.length - 1]!;
    this.after = last.seq;
    // A frame handed over in memory is its own Buffer; one read from the table is a slice of its
    // page, which a copy lets go.
    this.last = page ? { ...last, frame: typeof last.frame === 'string' ? Buffer.from(last.frame, 'latin1') : Buffer.from(last.frame) } : last;
  }

  private async readPage(): Promise<Frames> {
    const before = this.announced;
    const { pool } = this.deps;
    const { id } = this.request;
    const { after, last } = this;
    const { frames, more } = await this.db(() => readFrames(pool, id, after, PAGE, last));
    this.readTable = more; // a full page: there may be more
    // Otherwise the table has all there is: what was announced and is missing was discarded
    // (its attempt was superseded, which the state read tells).
    if (!this.readTable && this.announced === before) this.announced = Math.min(this.announced, frames.at(-1)?.seq ?? after);
    return { type: 'frames', frames, page: true };
  }

  /**
   * Reads the state (news says it changed): notes the answer of a settled request, and tells
   * whether the record vanished or the attempt whose frames were delivered is no longer live.
   */
  private async checkState(): Promise<'superseded' | 'vanished' | 'seen'> {
    this.readState = false; // before the read: news arriving during it sets it again
    let stored: StoredAnswer | null = null;
    if (this.request.streaming) {
      const { pool } = this.deps;
      const state = await this.db(() => readStreamState(pool, this.request.id));
      if (state === null) return 'vanished';
      // Frames were delivered from an attempt that is no longer the live one: its worker
      // died and the request went back to pending (or another attempt already took it).
      if (this.following !== null && !isTerminal(state.status) && (state.status === 'pending' || state.attempts !== this.following)) return 'superseded';
      if (isTerminal(state.status)) stored = await this.db(() => this.answerIfSettled());
    } else {
      stored = await this.db(() => this.answerIfSettled());
    }
    // The answer may have been handed over in memory while the read ran: a read that came too
    // early must not hide it (the watch would wait for the backstop poll).
    this.answer ??= stored;
    // Frames commit before the terminal write: those not yet delivered are in the table.
    if (this.answer) this.readTable = true;
    return 'seen';
  }

  /** The stored answer; null while the request has not settled. */
  private async answerIfSettled(): Promise<StoredAnswer | null> {
    const answer = await readAnswer(this.deps.pool, this.request.namespaceId, this.request.id);
    if (answer === undefined) throw new Error(`request ${this.request.id} vanished while watched`);
    return answer;
  }
}
