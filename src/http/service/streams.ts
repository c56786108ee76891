// Answers to callers: a settled request's stored answer, the live answer of a streaming
// submission (SPEC.md Endpoints rules 5-8) and the replay by id with `id:` lines and
// Last-Event-ID resume (SPEC.md "Events"). All of them read the request through watch().
import type { Request, Response } from 'express';
import type { BaseDeps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import type { StoredAnswer, BodyPages, ChunkRow } from '../../db/requests.ts';
import { watch, type Watched } from './watch.ts';

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
export async function sendAnswer(res: Response, a: StoredAnswer): Promise<void> {
  if (a.status === 'failed' && a.errorStatus !== null && a.retryAfter !== null) res.set('retry-after', a.retryAfter);
  // A failure that was not an HTTP answer: the stored body is our own envelope (upstream_failed
  // or cancelled), sent with that code's status.
  const status = a.status === 'succeeded' ? a.httpStatus : (a.errorStatus ?? a.httpStatus);
  const contentType = a.status === 'succeeded' ? (a.contentType ?? 'application/json') : 'application/json';
  res.status(status).set('content-type', contentType);
  if (Buffer.isBuffer(a.body)) {
    res.send(a.body);
    return;
  }
  res.set('content-length', String(a.body.length));
  for (let from = 0; from < a.body.length && !res.destroyed; from += BODY_SLICE) {
    await send(res, await a.body.read(from, BODY_SLICE));
  }
  res.end();
}

/** A body whole (failures are small: the executor keeps at most 1 MiB of a refusal). */
const wholeBody = async (body: Buffer | BodyPages): Promise<Buffer> => (Buffer.isBuffer(body) ? body : body.read(0, body.length));

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
const failedEvent = async (a: StoredAnswer): Promise<string> => sseEvent('failed', (await wholeBody(a.body)).toString('utf8'));

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

async function send(res: Response, chunk: string | Buffer): Promise<void> {
  if (!res.write(chunk)) await drained(res);
}

/** Writes frames in one go (the writes of one turn leave in one system call); waits once if the buffer is full. */
async function sendFrames(res: Response, frames: readonly ChunkRow[], withIds: boolean): Promise<void> {
  let ok = true;
  for (const f of frames) {
    if (withIds) res.write(`id: ${f.seq}\n`);
    ok = res.write(f.frame);
  }
  if (!ok) await drained(res);
}

/** An AbortSignal that fires when the caller goes away (a waiter leaving never touches the execution). */
export function callerLeft(res: Response): AbortSignal {
  const left = new AbortController();
  // 'close' follows every response; only one that closed unfinished was left. (An abort also
  // builds a DOMException with its stack: about 1% of the process's CPU at a few thousand
  // answers a second.)
  res.on('close', () => {
    if (!res.writableFinished) left.abort();
  });
  return left.signal;
}

/**
 * The answer of a non-streaming submission: the stored answer once the request settles, or
 * `504 held_too_long` when the hold passes first (the execution continues).
 */
export async function heldAnswer(deps: BaseDeps, res: Response, r: Watched, holdMs: number, fresh: boolean): Promise<void> {
  const left = callerLeft(res);
  const deadline = Date.now() + holdMs;
  for await (const ev of watch(deps, r, { afterSeq: 0, idleMs: holdMs, signal: left, fresh })) {
    if (ev.type === 'end') return sendAnswer(res, ev.answer);
    if (ev.type === 'idle' && Date.now() >= deadline) break;
  }
  if (left.aborted) {
    res.destroy(); // the caller is gone: release the connection, leave the execution running
    return;
  }
  throw new ServiceError(
    'held_too_long',
    `Gave up waiting after ${holdMs} ms; the execution continues as request ${r.id}. Re-send the identical body to attach to it, or read it by id.`,
  );
}

/**
 * The live answer of a streaming submission. It decides on its first item: a frame opens
 * `200 text/event-stream` (then the provider's own frames, no `id:` lines); a terminal state
 * answers as the stored outcome does; nothing within the hold is `504 held_too_long`.
 */
export async function liveStream(deps: BaseDeps, res: Response, r: Watched, holdMs: number, fresh: boolean): Promise<void> {
  const left = callerLeft(res);
  const deadline = Date.now() + holdMs;
  let started = false;
  let lastWrite = Date.now();
  const write = async (chunk: string | Buffer) => {
    lastWrite = Date.now();
    await send(res, chunk);
  };
  // Ticks often enough to keep the hold's deadline; keep-alives only when the stream is quiet.
  const idleMs = Math.max(10, Math.min(holdMs, 1000));
  following: for (;;) {
    for await (const ev of watch(deps, r, { afterSeq: 0, idleMs, signal: left, fresh })) {
      if (ev.type === 'frames') {
        if (!started) {
          res.writeHead(200, SSE_HEADERS);
          started = true;
        }
        lastWrite = Date.now();
        await sendFrames(res, ev.frames, false);
      } else if (ev.type === 'idle') {
        if (started && Date.now() - lastWrite >= KEEP_ALIVE_MS) await write(KEEP_ALIVE);
        if (!started && Date.now() >= deadline) {
          throw new ServiceError(
            'held_too_long',
            `No first item after ${holdMs} ms; the execution continues as request ${r.id}. Re-send the identical body to attach to it, or replay it by id.`,
          );
        }
      } else if (ev.type === 'superseded') {
        // Nothing sent yet: wait for the new attempt's first frame instead.
        if (!started) {
          fresh = false;
          continue following;
        }
        await write(SUPERSEDED_EVENT);
        break following;
      } else {
        if (!started) return sendAnswer(res, ev.answer);
        if (ev.answer.status === 'failed') await write(await failedEvent(ev.answer));
        break following;
      }
    }
    break;
  }
  if (left.aborted) res.destroy();
  else res.end();
}

/** Replay by id (`Accept: text/event-stream`): `id: <seq>` before each stored frame, then the live tail. */
export async function replay(deps: BaseDeps, req: Request, res: Response, r: Watched, keepAliveMs = KEEP_ALIVE_MS): Promise<void> {
  const lastEventId = req.headers['last-event-id'];
  let afterSeq = 0;
  if (lastEventId !== undefined) {
    if (!/^\d{1,9}$/.test(String(lastEventId).trim())) throw new ServiceError('bad_request', 'Last-Event-ID must be a sequence number.');
    afterSeq = Number(String(lastEventId).trim());
  }
  const left = callerLeft(res);
  res.writeHead(200, SSE_HEADERS);
  res.flushHeaders(); // a replay of a pending request shows its 200 at once, before any frame
  for await (const ev of watch(deps, r, { afterSeq, idleMs: keepAliveMs, signal: left })) {
    if (ev.type === 'frames') await sendFrames(res, ev.frames, true);
    else if (ev.type === 'idle') await send(res, KEEP_ALIVE);
    else if (ev.type === 'superseded') {
      await send(res, SUPERSEDED_EVENT);
      break;
    } else {
      if (ev.answer.status === 'failed') await send(res, await failedEvent(ev.answer));
      break;
    }
  }
  if (left.aborted) res.destroy();
  else res.end();
}
