// Answers to callers: a settled request's stored answer, the live answer of a streaming
// submission (docs/api.md "Streams") and the replay by id with `id:` lines and
// Last-Event-ID resume (docs/api.md "Replay"); a background response's resume by
// `starting_after` is the same writer through a view of its own (src/http/service/background.ts).
// All of them read the request through watch().
import type { Request, Response } from 'express';
import type { BaseDeps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import type { StoredAnswer, BodyPages, ChunkRow } from '../../db/requests.ts';
import type { Bytes } from '../../db/columns.ts';
import { watch, type Watched, type WatchEvent } from './watch.ts';

const KEEP_ALIVE_MS = 15_000;
// A comment line: not a frame, carries no id, keeps proxies from cutting an idle stream.
const KEEP_ALIVE = ': keep-alive\n\n';

const SSE_HEADERS = {
  'content-type': 'text/event-stream; charset=utf-8',
  'cache-control': 'no-cache',
  'x-accel-buffering': 'no',
};

// A large stored body is sent this much at a time, the next slice read once the socket took the last.
const BODY_SLICE = 64 * 1024;

/** The stored answer as the provider gave it: success or refusal byte for byte, or our 502. */
export async function sendAnswer(res: Response, answer: StoredAnswer): Promise<void> {
  if (answer.status === 'failed' && answer.errorStatus !== null && answer.retryAfter !== null) res.set('retry-after', answer.retryAfter);
  // A failure that was not an HTTP answer: the stored body is our own envelope (upstream_failed
  // or cancelled), sent with that code's status.
  const status = answer.status === 'succeeded' ? answer.httpStatus : (answer.errorStatus ?? answer.httpStatus);
  const contentType = answer.status === 'succeeded' ? (answer.contentType ?? 'application/json') : 'application/json';
  res.status(status).set('content-type', contentType);
  if (Buffer.isBuffer(answer.body)) {
    res.send(answer.body);
    return;
  }
  res.set('content-length', String(answer.body.length));
  for (let from = 0; from < answer.body.length && !res.destroyed; from += BODY_SLICE) {
    // Not held while the socket drains (an async function keeps its variables across an await).
    let slice: Bytes | null = await answer.body.read(from, BODY_SLICE);
    const ok = write(res, slice);
    slice = null;
    if (!ok) await drained(res);
  }
  res.end();
}

/** A body whole (failures are small: the executor keeps at most 1 MiB of a refusal). */
const wholeBody = async (body: Buffer | BodyPages): Promise<Buffer> => (Buffer.isBuffer(body) ? body : asBuffer(await body.read(0, body.length)));

const asBuffer = (bytes: Bytes): Buffer => (typeof bytes === 'string' ? Buffer.from(bytes, 'latin1') : bytes);

/** Writes bytes read from the database: text as the bytes its characters are (see Bytes). */
const write = (res: Response, bytes: Bytes, done?: () => void): boolean =>
  typeof bytes === 'string' ? res.write(bytes, 'latin1', done) : res.write(bytes, done);

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

/** The stored error as an `event: failed` (no id: a failure is not a place to resume from). */
const failedEvent = async (answer: StoredAnswer): Promise<string> => sseEvent('failed', (await wholeBody(answer.body)).toString('utf8'));

/** Resolves once the write buffer drains (or the caller left), so a slow reader is not buffered for. */
function drained(res: Response): Promise<void> {
  return new Promise((resolve) => {
    // A caller already gone never drains (and 'close' came before): waiting would hold this
    // request's state, and the page it was sending, for good.
    if (res.destroyed || res.closed) return resolve();
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

/** Writes a chunk; resolves at once, or once the buffer drained if it filled. */
export async function send(res: Response, chunk: string | Buffer): Promise<void> {
  if (!res.write(chunk)) await drained(res);
}

type Frames = Extract<WatchEvent, { type: 'frames' }>;
const SENT: readonly ChunkRow[] = [];

/**
 * Writes frames (behind `id:` lines in a replay) in one go: the writes of one turn leave in one
 * system call. Resolves once the buffer drained, if it filled; after a page read from the table,
 * once the socket took all of it, so that the next page is read only then and no page waits in
 * memory behind another. Empties the event: it was its page's last holder (see watch.ts).
 */
function sendFrames(res: Response, batch: Frames, withIds: boolean): Promise<void> | undefined {
  const { frames, page } = batch;
  batch.frames = SENT;
  let ok = true;
  for (let i = 0; i < frames.length; i++) {
    if (withIds) res.write(`id: ${frames[i]!.seq}\n`);
    if (page && i === frames.length - 1) {
      const sent = written(res, (done) => write(res, frames[i]!.frame, done));
      // A page read from the table is this reader's alone, and the read's promises (made before
      // it waited for a connection) still hold its array: emptied, it keeps nothing of the page
      // once the socket took it (see readFrames in src/db/chunks.ts).
      (frames as ChunkRow[]).length = 0;
      return sent;
    }
    ok = write(res, frames[i]!.frame);
  }
  return ok ? undefined : drained(res);
}

/** Makes the last write of a batch (`writeLast` passes `done` on as its callback) and resolves once the socket took it, or the caller left. */
function written(res: Response, writeLast: (done: () => void) => void): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off('close', done);
      resolve();
    };
    res.on('close', done);
    writeLast(done);
  });
}

/** An AbortSignal that fires when the caller goes away (a waiter leaving never touches the execution). */
export function callerLeft(res: Response): AbortSignal {
  const left = new AbortController();
  // 'close' follows every response; only one that closed unfinished was left, and only that
  // one pays for an abort (it builds a DOMException with its stack).
  res.on('close', () => {
    if (!res.writableFinished) left.abort();
  });
  return left.signal;
}

/**
 * The answer of a non-streaming submission: the stored answer once the request settles, or
 * `504 held_too_long` when the hold passes first (the execution continues).
 */
export async function heldAnswer(deps: BaseDeps, res: Response, request: Watched, holdMs: number, fresh: boolean): Promise<void> {
  const left = callerLeft(res);
  const deadline = Date.now() + holdMs;
  for await (const ev of watch(deps, request, { afterSeq: 0, idleMs: holdMs, signal: left, fresh })) {
    if (ev.type === 'end') return sendAnswer(res, ev.answer);
    if (ev.type === 'idle' && Date.now() >= deadline) break;
  }
  if (left.aborted) {
    res.destroy(); // the caller is gone: release the connection, leave the execution running
    return;
  }
  throw new ServiceError(
    'held_too_long',
    `Gave up waiting after ${holdMs} ms; the execution continues as request ${request.id}. Re-send the identical body to attach to it, or read it by id.`,
  );
}

/**
 * The live answer of a streaming submission. It decides on its first item: a frame opens
 * `200 text/event-stream` (then the provider's own frames, no `id:` lines); a terminal state
 * answers as the stored outcome does; nothing within the hold is `504 held_too_long`.
 */
export async function liveStream(deps: BaseDeps, res: Response, request: Watched, holdMs: number, fresh: boolean): Promise<void> {
  const left = callerLeft(res);
  // Ticks often enough to keep the hold's deadline; keep-alives only when the stream is quiet.
  const idleMs = Math.max(10, Math.min(holdMs, 1000));
  const first = await firstItem((fromFresh) => watch(deps, request, { afterSeq: 0, idleMs, signal: left, fresh: fromFresh }), fresh, Date.now() + holdMs);
  switch (first.type) {
    case 'end':
      return sendAnswer(res, first.answer);
    case 'held_too_long':
      throw new ServiceError(
        'held_too_long',
        `No first item after ${holdMs} ms; the execution continues as request ${request.id}. Re-send the identical body to attach to it, or replay it by id.`,
      );
    case 'gone':
      return finish(res, left);
    case 'frames':
      // The first frame's sequence number: a client resuming by id counts on from it (docs/clients.md).
      res.writeHead(200, { ...SSE_HEADERS, 'x-sarsen-first-seq': String(first.first.frames[0]!.seq) });
      return writeEvents(res, first.rest, { ids: false, keepAliveMs: KEEP_ALIVE_MS, left, view: SARSEN, first: first.first });
  }
}

type FirstItem =
  /** The first frames, and the watch that carries on after them. */
  | { type: 'frames'; first: Frames; rest: AsyncGenerator<WatchEvent> }
  | { type: 'end'; answer: StoredAnswer }
  | { type: 'held_too_long' }
  /** The watch ended with nothing to send (the caller left). */
  | { type: 'gone' };

/**
 * Waits for what decides a live stream's answer: its first frames or the request's end, until
 * `deadline`. An attempt superseded before its first frame sent nothing to anyone: the next
 * attempt's first frame is waited for instead, in a watch that reads what is stored.
 */
async function firstItem(open: (fresh: boolean) => AsyncGenerator<WatchEvent>, fresh: boolean, deadline: number): Promise<FirstItem> {
  for (let events = open(fresh); ; events = open(false)) {
    let handedOn = false;
    try {
      for (;;) {
        const next = await events.next();
        if (next.done) return { type: 'gone' };
        const ev = next.value;
        if (ev.type === 'frames') {
          handedOn = true;
          return { type: 'frames', first: ev, rest: events };
        }
        if (ev.type === 'end') return { type: 'end', answer: ev.answer };
        if (ev.type === 'superseded') break;
        if (Date.now() >= deadline) return { type: 'held_too_long' };
      }
    } finally {
      if (!handedOn) await events.return(undefined);
    }
  }
}

/** Replay by id (`Accept: text/event-stream`): `id: <seq>` before each stored frame, then the live tail. */
export async function replay(deps: BaseDeps, req: Request, res: Response, request: Watched, keepAliveMs = KEEP_ALIVE_MS): Promise<void> {
  const lastEventId = req.headers['last-event-id'];
  let afterSeq = 0;
  if (lastEventId !== undefined) {
    if (!/^\d{1,9}$/.test(String(lastEventId).trim())) throw new ServiceError('bad_request', 'Last-Event-ID must be a sequence number.');
    afterSeq = Number(String(lastEventId).trim());
  }
  await readStream(deps, res, request, { afterSeq, ids: true, keepAliveMs });
}

/**
 * How a stream read by id is told: which of its frames the reader gets, and what ends it. Sarsen's
 * own (SARSEN) sends every frame; a vendor's resume (a background response's `starting_after`,
 * docs/api.md "Background responses") reads positions of its own. Every string answered is the
 * event the stream ends with.
 */
export type StreamView = {
  /** Before anything is read: the event that ends the stream at once (the reader's position is gone), or null. */
  start?(): string | null;
  /** Per frame, in order: send it (true), pass over it (false), or end the stream before it with an event. Absent: all are sent. */
  frame?(f: ChunkRow): boolean | string;
  /** The attempt whose frames were sent was discarded. */
  superseded(): string;
  /** The request ended with `answer`: the event to end with, or null. */
  end(answer: StoredAnswer): string | null | Promise<string | null>;
};

const SARSEN: StreamView = {
  superseded: () => SUPERSEDED_EVENT,
  end: (answer) => (answer.status === 'failed' ? failedEvent(answer) : null),
};

/**
 * A request's stream read by id: `200 text/event-stream` at once (a pending request's shows
 * before any frame), its stored frames after `afterSeq`, then the live tail until it ends.
 * `ids`: `id: <seq>` lines before the frames (Sarsen's replay).
 */
export async function readStream(
  deps: BaseDeps,
  res: Response,
  request: Watched,
  opts: { afterSeq?: number; ids?: boolean; view?: StreamView; keepAliveMs?: number },
): Promise<void> {
  const left = callerLeft(res);
  res.writeHead(200, SSE_HEADERS);
  res.flushHeaders();
  const view = opts.view ?? SARSEN;
  const opening = view.start?.() ?? null;
  if (opening !== null) return finish(res, left, opening);
  // Its watch ticks at the keep-alive interval: every tick is a keep-alive.
  const events = watch(deps, request, { afterSeq: opts.afterSeq ?? 0, idleMs: opts.keepAliveMs ?? KEEP_ALIVE_MS, signal: left });
  await writeEvents(res, events, { ids: opts.ids ?? false, keepAliveMs: 0, left, view });
}

/**
 * Writes a watch's events to an open event stream until the watch ends: the frames the view
 * keeps (behind `id:` lines in a replay), a keep-alive on an idle tick once nothing was written
 * for `keepAliveMs`, and at the end the view's event (Sarsen's: a `failed` event when the
 * request failed or its attempt was superseded). `first`: frames already taken from the watch,
 * written before the rest.
 */
async function writeEvents(
  res: Response,
  events: AsyncGenerator<WatchEvent>,
  opts: { ids: boolean; keepAliveMs: number; left: AbortSignal; view: StreamView; first?: Frames },
): Promise<void> {
  const { view } = opts;
  // Monotonic, so a keep-alive due at every tick (keepAliveMs 0) is sent at every tick.
  let lastWrite = performance.now();
  // The event the stream ends with, once one is known.
  let last: string | null = null;
  if (opts.first) {
    last = view.frame ? keep(opts.first, view.frame) : null;
    await sendFrames(res, opts.first, opts.ids);
  }
  if (last !== null) await events.return(undefined);
  else {
    for await (const ev of events) {
      if (ev.type === 'frames') {
        lastWrite = performance.now();
        last = view.frame ? keep(ev, view.frame) : null;
        await sendFrames(res, ev, opts.ids);
        if (last !== null) break;
      } else if (ev.type === 'idle') {
        if (performance.now() - lastWrite >= opts.keepAliveMs) {
          lastWrite = performance.now();
          await send(res, KEEP_ALIVE);
        }
      } else {
        last = ev.type === 'superseded' ? view.superseded() : await view.end(ev.answer);
        break;
      }
    }
  }
  finish(res, opts.left, last);
}

/**
 * Leaves in `batch` the frames `frame` passes, in place: a page's array is the one its read's
 * promises hold, and sendFrames empties it (see there). Answers the event that ends the stream
 * before the first frame not passed, or null.
 */
function keep(batch: Frames, frame: (f: ChunkRow) => boolean | string): string | null {
  const frames = batch.frames as ChunkRow[];
  let kept = 0;
  let stop: string | null = null;
  for (const f of frames) {
    const verdict = frame(f);
    if (typeof verdict === 'string') {
      stop = verdict;
      break;
    }
    if (verdict) frames[kept++] = f;
  }
  if (kept < frames.length) frames.length = kept;
  return stop;
}

/** Ends the response (after `last`, an event that ends the stream), or drops the connection of a caller that left (the execution goes on). */
function finish(res: Response, left: AbortSignal, last: string | null = null): void {
  if (left.aborted) res.destroy();
  else if (last !== null) res.end(last);
  else res.end();
}
