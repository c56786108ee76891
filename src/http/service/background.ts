// Background responses (docs/api.md "Background responses"): the reference vendor's background
// mode, performed by Sarsen for every Responses backend. Create answers at once; retrieve,
// resume, cancel, delete and input items read what Sarsen stored, by Sarsen's request id or by
// the provider's `resp_...` id. Errors on these routes are the vendor's error shape, so its SDK
// raises its own classes.
import type { Request, Response, Router, RequestHandler } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { parseCanonical, isJsonObject, type JsonObject } from '../../core/canonical-json.ts';
import { idTime } from '../../core/ids.ts';
import { openaiList } from '../../core/vendor-api.ts';
import {
  responseObject, responseError, terminalResponse, errorEvent, inputItems, frameSequence, ownResponseId, type ResponseStatus,
} from '../../core/background.ts';
import { readResponse, type ResponseRow } from '../../db/background.ts';
import { readLastFrames, frameBytes } from '../../db/chunks.ts';
import type { ChunkRow } from '../../db/requests.ts';
import { sweepRecord } from '../../db/retention.ts';
import { cancelRequest } from '../../db/cancel.ts';
import { isTerminal, requestTraceParent } from '../../db/requests.ts';
import { watch } from './watch.ts';
import { callerLeft, readStream, type StreamView } from './streams.ts';
import { serviceAuthOf } from '../service-auth.ts';
import type { AcceptedSubmission } from './submit.ts';
import { trackStream } from '../../metrics/metrics.ts';
import { vendorRoute, sendJson, limitParam, orderParam, idParam, countParam } from './vendor-routes.ts';
import { tracer } from '../../telemetry/tracing.ts';
import { traceReplay } from '../../telemetry/spans.ts';

// How long a cancel waits for the running attempt to stop, so it can answer `cancelled`.
const CANCEL_WAIT_MS = 10_000;
const SUPERSEDED_MESSAGE =
  'The worker producing this response died and another attempt took it over; the events after starting_after belonged to the discarded attempt. ' +
  'Retrieve the stream again without starting_after to read the new attempt from its first event.';

/** The stored body, parsed (numbers keep their spelling), or null. */
function storedBody(row: ResponseRow): JsonObject | null {
  if (row.body === null) return null;
  try {
    const { value } = parseCanonical(row.body);
    return isJsonObject(value) ? value : null;
  } catch {
    return null;
  }
}

/** A request a response id names, with a succeeded stream's last frames when a route renders it. */
type Found = ResponseRow & { lastFrames: ChunkRow[] };

/** The Response a request's state shows, as JSON text (the provider's own once it has one). */
function renderResponse(row: Found, askedId: string): string {
  const body = storedBody(row);
  const own = (status: ResponseStatus, error: { code: string; message: string } | null = null) =>
    responseObject({ id: askedId, createdAtMs: idTime(row.id), status, model: row.model, body, background: body?.background === true, error });
  switch (row.status) {
    case 'pending':
      return own('queued');
    case 'running':
      return own('in_progress');
    case 'succeeded': {
      if (!row.streaming) return row.response_body!.toString('utf8');
      // A stream: its terminal event's `response`, byte for byte.
      const frames = row.lastFrames;
      for (let i = frames.length - 1; i >= 0; i--) {
        const response = terminalResponse(frameBytes(frames[i]!).toString('utf8'));
        if (response !== null) return response;
      }
      return own('incomplete');
    }
    case 'failed': {
      const stored = row.response_body ?? Buffer.alloc(0);
      const error = responseError(stored, row.error_status);
      return row.cancel_requested && error.code === 'cancelled' ? own('cancelled') : own('failed', error);
    }
  }
}

/** What a route reads of a response: the stored request body; a stream's final Response (to render it). */
type Reading = { body: boolean; terminal: boolean };
const RENDERED: Reading = { body: true, terminal: true };

/**
 * The request a response id names in the caller's namespace; 404 or 410 otherwise. `terminal`:
 * a succeeded stream's last frames, which hold its final Response (as large as the whole answer).
 */
async function found(deps: Deps, res: Response, id: string, read: Reading): Promise<Found> {
  const row = await readResponse(deps.pool, serviceAuthOf(res).namespaceId, id, read);
  if (!row || row.dialect !== 'responses') throw new ServiceError('not_found', `No response with id ${JSON.stringify(id.slice(0, 100))} in this namespace.`);
  if (row.expired) throw new ServiceError('record_expired', 'The response ran, but its stored body and answer were removed (deleted, or swept by retention).');
  const rendersStream = read.terminal && row.streaming && row.status === 'succeeded';
  return { ...row, lastFrames: rendersStream ? await readLastFrames(deps.pool, row.id) : [] };
}

/** POST /responses with background and no stream: the Response as it stands, at once. */
export async function answerBackground(deps: Deps, res: Response, accepted: AcceptedSubmission): Promise<void> {
  const row = await found(deps, res, accepted.requestId, { body: false, terminal: true });
  sendJson(res, renderResponse(row, ownResponseId(accepted.requestId)));
}

async function retrieve(deps: Deps, req: Request, res: Response): Promise<void> {
  const id = String(req.params.id);
  const streaming = req.query.stream === 'true';
  const startingAfter = countParam(req, 'starting_after');
  if (startingAfter !== null && !streaming) throw new ServiceError('bad_request', '`starting_after` needs `stream=true`.');
  // A stream read again needs neither: it is read from its frames.
  const row = await found(deps, res, id, { body: !streaming, terminal: !streaming });
  if (!streaming) return sendJson(res, renderResponse(row, id));
  if (!row.streaming) throw new ServiceError('bad_request', 'This response was not created with `stream: true`; retrieve it without `stream`.');
  const resuming = () => resume(deps, res, row, startingAfter);
  // Traced, a stream retrieved again is a replay: a span linked to the request's trace (docs/operations.md "Tracing").
  const t = tracer;
  await trackStream('replay', t === null ? resuming : async () => traceReplay(t, row.id, await requestTraceParent(deps.pool, row.id).catch(() => null), resuming));
}

/**
 * The stored events after `startingAfter` byte for byte, then the live tail (docs/api.md
 * "Background responses"). A position is the provider's `sequence_number`, or where the provider
 * numbers none, the event's place in its attempt counted from 0. A position is one attempt's:
 * when that attempt was discarded, the reader gets the dialect's `error` event instead.
 */
function resume(deps: Deps, res: Response, row: ResponseRow, startingAfter: number | null): Promise<void> {
  const request = { id: row.id, namespaceId: serviceAuthOf(res).namespaceId, streaming: true };
  return readStream(deps, res, request, { view: positions(row, startingAfter) });
}

/** The reading of a Responses stream by position: the events after `startingAfter`, of the attempt the reader followed. */
function positions(row: ResponseRow, startingAfter: number | null): StreamView {
  // The attempt the reader followed: the provider's id names it; Sarsen's id cannot tell once an
  // earlier attempt's events were discarded.
  let expected = startingAfter !== null ? row.named_attempt : null;
  let firstSeq = 0;
  let skipping = startingAfter !== null;
  let last = startingAfter ?? -1;
  const superseded = () => errorEvent('response_superseded', SUPERSEDED_MESSAGE, last + 1);
  return {
    start() {
      if (startingAfter === null) return null;
      const discarded = row.named_attempt !== null
        ? row.named_attempt !== row.attempts || row.status === 'pending'
        : (row.stream_first_seq ?? 1) > 1;
      return discarded ? superseded() : null;
    },
    frame(f) {
      if (expected === null || firstSeq === 0) {
        expected ??= f.attempt;
        firstSeq = f.seq;
      }
      if (f.attempt !== expected) return superseded();
      const position = frameSequence(typeof f.frame === 'string' ? f.frame : f.frame.toString('latin1')) ?? f.seq - firstSeq;
      if (skipping && position <= startingAfter!) return false;
      skipping = false;
      last = position;
      return true;
    },
    superseded,
    end(answer) {
      // The provider's own failure events are frames; what ends here failed on Sarsen's side
      // (a transport failure, a cancel): told as the dialect's error event.
      if (answer.status !== 'failed') return null;
      const error = responseError(Buffer.isBuffer(answer.body) ? answer.body : Buffer.alloc(0), answer.errorStatus);
      return errorEvent(error.code, error.message, last + 1);
    },
  };
}

async function cancel(deps: Deps, req: Request, res: Response): Promise<void> {
  const id = String(req.params.id);
  const namespaceId = serviceAuthOf(res).namespaceId;
  let row = await found(deps, res, id, RENDERED);
  // An ended response answers as it stands (the vendor's own answer for one that ended).
  if (!isTerminal(row.status)) {
    const done = await cancelRequest(deps.pool, namespaceId, row.id, { metering: deps.settings.current().metering_enabled, origin: deps.processId });
    if (done?.kind === 'cancelling') deps.bus.publishRequest({ type: 'cancel', requestId: row.id });
    if (done?.kind === 'cancelled' && done.answer) deps.bus.publishRequest({ type: 'state', requestId: row.id, status: 'failed', answer: done.answer });
    if (done?.kind === 'cancelling') {
      // Wait (bounded) for the attempt to stop, so the answer says `cancelled`; a provider that
      // finished first wins, and the answer then says so.
      const left = callerLeft(res);
      const signal = AbortSignal.any([left, AbortSignal.timeout(CANCEL_WAIT_MS)]);
      for await (const ev of watch(deps, { id: row.id, namespaceId, streaming: false }, { afterSeq: 0, idleMs: 1000, signal })) {
        if (ev.type === 'end') break;
      }
    }
    row = await found(deps, res, id, RENDERED);
  }
  sendJson(res, renderResponse(row, id));
}

async function remove(deps: Deps, req: Request, res: Response): Promise<void> {
  const id = String(req.params.id);
  const row = await found(deps, res, id, { body: false, terminal: false });
  if (!isTerminal(row.status)) throw new ServiceError('conflict', 'The response is still running: cancel it, or wait for it to end, before deleting it.');
  await sweepRecord(deps.pool, serviceAuthOf(res).namespaceId, row.id);
  sendJson(res, { id, object: 'response', deleted: true });
}

async function listInputItems(deps: Deps, req: Request, res: Response): Promise<void> {
  const id = String(req.params.id);
  const limit = limitParam(req, 20, 100);
  const order = orderParam(req);
  const after = idParam(req, 'after');
  const row = await found(deps, res, id, { body: true, terminal: false });
  const body = storedBody(row);
  let items = body ? inputItems(body, row.id) : [];
  if (order === 'desc') items = items.reverse();
  if (after !== null) {
    const at = items.findIndex((item) => item.id === after);
    if (at === -1) throw new ServiceError('bad_request', `No input item ${JSON.stringify(after.slice(0, 100))} in this response.`);
    items = items.slice(at + 1);
  }
  sendJson(res, openaiList(items, limit));
}

/** The routes beside POST /responses (docs/api.md "Background responses"). */
export function backgroundRoutes(deps: Deps, router: Router, base: string, use: RequestHandler): void {
  router.get(`${base}/responses/:id`, use, vendorRoute(deps, retrieve));
  router.post(`${base}/responses/:id/cancel`, use, vendorRoute(deps, cancel));
  router.delete(`${base}/responses/:id`, use, vendorRoute(deps, remove));
  router.get(`${base}/responses/:id/input_items`, use, vendorRoute(deps, listInputItems));
}
