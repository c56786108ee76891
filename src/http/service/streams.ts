// Streams to callers: the live answer of a streaming submission (SPEC.md Endpoints rules 5-8)
// and the replay by id with `id:` lines and Last-Event-ID resume (SPEC.md "Events").
import type { Request, Response } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { readRecord, type RecordRow } from '../../db/requests.ts';
import { follow, sseEvent, SUPERSEDED_EVENT } from './follow.ts';

const KEEP_ALIVE_MS = 15_000;
// A comment line: not a frame, carries no id, keeps proxies from cutting an idle stream.
const KEEP_ALIVE = ': keep-alive\n\n';

const SSE_HEADERS = {
  'content-type': 'text/event-stream; charset=utf-8',
  'cache-control': 'no-cache',
  'x-accel-buffering': 'no',
};

/** The stored error as an `event: failed` (no id: a failure is not a place to resume from). */
function failedEvent(r: RecordRow | null): string {
  const body = r?.response_body?.toString('utf8') ?? JSON.stringify({ error: { code: 'upstream_failed', message: 'The request failed.' } });
  return sseEvent('failed', body);
}

/** Resolves once the write buffer drains (or the caller left), so a slow reader is not buffered for. */
function drained(res: Response): Promise<void> {
  return new Promise((resolve) => {
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

/**
 * The live answer of a streaming submission. It decides on its first item: a frame opens
 * `200 text/event-stream` (then the provider's own frames, no `id:` lines); a terminal state
 * answers as the stored outcome does; nothing within the hold is `504 held_too_long`.
 */
export async function liveStream(
  deps: Deps,
  res: Response,
  namespaceId: string,
  requestId: string,
  holdMs: number,
  sendStored: (r: RecordRow) => void,
): Promise<void> {
  const left = new AbortController();
  res.on('close', () => left.abort());
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
    for await (const ev of follow(deps, requestId, { afterSeq: 0, idleMs, signal: left.signal })) {
      if (ev.type === 'frame') {
        if (!started) {
          res.writeHead(200, SSE_HEADERS);
          started = true;
        }
        await write(ev.frame);
      } else if (ev.type === 'idle') {
        if (started && Date.now() - lastWrite >= KEEP_ALIVE_MS) await write(KEEP_ALIVE);
        if (!started && Date.now() >= deadline) {
          throw new ServiceError(
            'held_too_long',
            `No first item after ${holdMs} ms; the execution continues as request ${requestId}. Re-send the identical body to attach to it, or replay it by id.`,
          );
        }
      } else if (ev.type === 'superseded') {
        // Nothing sent yet: wait for the new attempt's first frame instead.
        if (!started) continue following;
        await write(SUPERSEDED_EVENT);
        break following;
      } else {
        const record = await readRecord(deps.pool, namespaceId, requestId);
        if (!started) {
          if (!record) throw new Error(`request ${requestId} vanished`);
          sendStored(record);
          return;
        }
        if (ev.status === 'failed') await write(failedEvent(record));
        break following;
      }
    }
    break;
  }
  if (left.signal.aborted) res.destroy();
  else res.end();
}

/** Replay by id (`Accept: text/event-stream`): `id: <seq>` before each stored frame, then the live tail. */
export async function replay(deps: Deps, req: Request, res: Response, record: RecordRow, keepAliveMs = KEEP_ALIVE_MS): Promise<void> {
  const lastEventId = req.headers['last-event-id'];
  let afterSeq = 0;
  if (lastEventId !== undefined) {
    if (!/^\d{1,9}$/.test(String(lastEventId).trim())) throw new ServiceError('bad_request', 'Last-Event-ID must be a sequence number.');
    afterSeq = Number(String(lastEventId).trim());
  }
  const left = new AbortController();
  res.on('close', () => left.abort());
  res.writeHead(200, SSE_HEADERS);
  res.flushHeaders(); // a replay of a pending request shows its 200 at once, before any frame
  for await (const ev of follow(deps, record.id, { afterSeq, idleMs: keepAliveMs, signal: left.signal })) {
    if (ev.type === 'frame') await send(res, Buffer.concat([Buffer.from(`id: ${ev.seq}\n`), ev.frame]));
    else if (ev.type === 'idle') await send(res, KEEP_ALIVE);
    else if (ev.type === 'superseded') {
      await send(res, SUPERSEDED_EVENT);
      break;
    } else {
      if (ev.status === 'failed') await send(res, failedEvent(await readRecord(deps.pool, record.namespace_id, record.id)));
      break;
    }
  }
  if (left.signal.aborted) res.destroy();
  else res.end();
}
