// One attempt at a request, from the provider's side: call it, read what it answers (a whole
// answer, or a stream whose frames are group-committed as they arrive), and say how the
// attempt ended. Writing that outcome is settle.ts's; the attempt's life (lease, slots,
// hand-back) is attempt-runner.ts's.
import type { Readable } from 'node:stream';
import type { Settings } from '../config/settings.ts';
import type { BaseDeps } from '../deps.ts';
import type { Attempt, AttemptEnd, Tokens, Traffic } from '../db/attempts.ts';
import type { Answer } from '../db/requests.ts';
import type { BackendForCall } from '../db/backends.ts';
import { openBackendCredential } from '../control/backends.ts';
import { open } from '../core/sealing.ts';
import { tokensFromAnswer, createStreamTokenReader } from '../core/tokens.ts';
import { isProviderFailureFrame, isStreamEndFrame } from '../core/response-cache.ts';
import { createFramer } from '../core/sse-framer.ts';
import { createFrameEncoder } from '../core/frame-delta.ts';
import { isRetryableStatus, parseRetryAfter, nextDelayMs } from '../core/retry.ts';
import { errorBody } from '../core/errors.ts';
import { createCommitBacklog } from '../core/commit-backlog.ts';
import { cancelledAnswer } from '../db/cancel.ts';
import { recordProviderResponseId } from '../db/background.ts';
import { retryTransient } from '../db/pool.ts';
import { upstreamBody, answerResponseId, frameResponseId } from '../core/background.ts';
import type { ChunkWriter } from './chunk-writer.ts';
import { TransportError, describeTransportError, type Sent, type Upstream, type UpstreamResponse } from './upstream.ts';
import { logger } from '../log.ts';
import { tracer } from '../telemetry/tracing.ts';
import { traceProviderCall, type CallTrace } from '../telemetry/spans.ts';
import { OPERATION, providerName } from '../core/genai.ts';
import { idTime } from '../core/ids.ts';
import { observeProviderCall, observeAcceptanceToCall, observeFirstFrame, countRetry, observeGenAiCall } from '../metrics/metrics.ts';

// A JSON answer larger than this is refused rather than held in memory.
const MAX_ANSWER_BYTES = 64 * 1024 * 1024;
const MAX_ERROR_BYTES = 1024 * 1024;
// Frames of one stream handed to the chunk writer and not yet committed before reading pauses.
const MAX_UNCOMMITTED = 1024;

export type ExecutorDeps = BaseDeps & { upstream: Upstream; chunks: ChunkWriter };

/** What a streamed attempt stored: its frames' bytes and the sequence number of its last frame. */
export type StoredFrames = { bytes: number; lastSeq: number };

/** How an attempt ended; settle.ts writes it (`end`: for the attempt log). */
export type Outcome =
  /** `cacheable`: not a stream the provider ended with its own failure event, nor one without its last event (docs/api.md "Response cache"). */
  | ({ kind: 'succeeded'; answer: Answer; tokens: Tokens; frames: StoredFrames | null; cacheable: boolean; end: AttemptEnd } & Traffic)
  /**
   * Terminal: a refusal the provider answered with, a transport failure past the last attempt,
   * or a cancel (`tokens`: what the frames stored so far tell).
   */
  | ({ kind: 'failed'; answer: Answer; frames: StoredFrames | null; tokens?: Tokens; cancelled?: boolean; end: AttemptEnd } & Traffic)
  | ({ kind: 'retry'; delayMs: number; end: AttemptEnd } & Traffic)
  /** Another attempt holds the request now: nothing of this one may be written. */
  | { kind: 'lease_lost' }
  /** This process gives the attempt back (it is stopping, or lost its database). */
  | { kind: 'handed_back'; reason: 'shutdown' | 'database connection lost'; cause?: string };

/** The abort reason when the lease was found taken. */
export class LeaseLost extends Error {
  override name = 'LeaseLost';
}

/** The abort reason a stopping process gives attempts that could not finish within its grace. */
export class HandBack extends Error {
  override name = 'HandBack';
}

/** The abort reason when a cancel was asked for (POST /requests/{id}/cancel). */
export class Cancelled extends Error {
  override name = 'Cancelled';
}

/** Storing a frame failed (the database, not the provider): the attempt cannot go on here. */
export class StoreFailed extends Error {
  override name = 'StoreFailed';
  constructor(cause: unknown) {
    super('storing a stream frame failed', { cause });
  }
}

// How many frames of a Responses stream are looked at for the provider's response id (the
// vendor's first event, response.created, carries it).
const ID_FRAMES = 8;

/**
 * Records the provider's response id of a Responses attempt (docs/api.md "Background
 * responses"), before what carries it is stored, so every id a caller sees can be retrieved.
 * A database that stays away costs only the lookup by that id, never the attempt.
 */
async function noteResponseId(deps: ExecutorDeps, attempt: Attempt, providerId: string | null, settings: Settings): Promise<void> {
  if (providerId === null) return;
  const row = { namespaceId: attempt.namespaceId, providerId, requestId: attempt.id, attempt: attempt.attempt };
  await retryTransient(() => recordProviderResponseId(deps.pool, row), settings.lease_ms).catch((err: unknown) => {
    logger.warn('provider response id not recorded', { request_id: attempt.id, attempt: attempt.attempt, reason: err instanceof Error ? err.message : String(err) });
  });
}

const NO_TRAFFIC: Traffic = { reached: false, sentBytes: 0, receivedBytes: 0 };
const ended = (status: number | null, retryAfter: string | null = null, error: string | null = null): AttemptEnd => ({ status, retryAfter, error });
const traffic = (sent: Sent, receivedBytes: number): Traffic => ({ reached: sent.reached, sentBytes: sent.bytes, receivedBytes });

/** Our own upstream_failed envelope, stored as the failure's body (docs/api.md "Errors": not an HTTP answer). */
function transportAnswer(err: TransportError): Answer {
  return {
    status: 'failed',
    httpStatus: 502,
    contentType: 'application/json',
    body: Buffer.from(errorBody('upstream_failed', err.message)),
    errorStatus: null,
    retryAfter: null,
  };
}

/**
 * The attempt's call was aborted: a cancel ends the request with what it moved and stored;
 * any other reason is the attempt runner's (thrown).
 */
function aborted(signal: AbortSignal, moved: Traffic, frames: StoredFrames | null = null, tokens?: Tokens): Outcome {
  if (!(signal.reason instanceof Cancelled)) throw signal.reason;
  return { kind: 'failed', answer: cancelledAnswer(), frames, tokens, cancelled: true, end: ended(null), ...moved };
}

/** The backend's own credential, or for a caller-credential backend the one this request brought. */
function attemptCredential(deps: ExecutorDeps, attempt: Attempt, backend: BackendForCall): string | null {
  if (backend.credential_source !== 'caller') return openBackendCredential(deps.keyring, backend);
  if (!attempt.sealedCredential) throw new TransportError('The caller credential of this request is no longer held.', { refused: true });
  return open(deps.keyring, attempt.sealedCredential, attempt.id);
}

/**
 * The whole body, refused past `limit` bytes, read through the stream's events: `for await` over
 * it costs an async iterator, an end-of-stream watcher and a promise a chunk, a large share of what
 * a non-streaming request allocates (docs/measurements.md).
 */
function readAll(stream: Readable, limit: number): Promise<Buffer> {
  return new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const done = (err: Error | null) => {
      stream.off('data', onData);
      stream.off('end', onEnd);
      stream.off('error', onError);
      stream.off('close', onClose);
      if (err) reject(err);
      else resolve(Buffer.concat(chunks, size));
    };
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) return done(new TransportError(`The provider's answer is larger than ${limit} bytes.`));
      chunks.push(chunk);
    };
    const onEnd = () => done(null);
    const onError = (err: Error) => done(err);
    // Closed without its end (destroyed): as `for await` reports it.
    const onClose = () => done(stream.errored ?? Object.assign(new Error('Premature close'), { code: 'ERR_STREAM_PREMATURE_CLOSE' }));
    if (stream.errored) return reject(stream.errored);
    if (stream.destroyed) return onClose();
    stream.on('data', onData);
    stream.on('end', onEnd);
    stream.on('error', onError);
    stream.on('close', onClose);
  });
}

function header(res: UpstreamResponse, name: string): string | null {
  const v = res.headers[name];
  if (v === undefined) return null;
  return Array.isArray(v) ? v.join(', ') : v;
}

/** A transport failure: another attempt when one is left and the failure is worth retrying. */
function transportFailure(attempt: Attempt, settings: Settings, traffic: Traffic, err: TransportError): Outcome {
  logger.warn('provider call failed', { request_id: attempt.id, attempt: attempt.attempt, reason: err.message });
  if (!err.refused && attempt.attempt < settings.max_attempts) {
    countRetry('transport');
    return { kind: 'retry', delayMs: nextDelayMs({ attempt: attempt.attempt, baseMs: settings.retry_base_ms, maxMs: settings.retry_max_ms, retryAfterMs: null }), end: ended(null, null, err.message), ...traffic };
  }
  return { kind: 'failed', answer: transportAnswer(err), frames: null, end: ended(null, null, err.message), ...traffic };
}

/**
 * Runs the attempt against the provider and answers how it ended. Throws only when `signal`
 * aborted it for a reason other than a cancel (the reason says why) or a frame could not be
 * stored (StoreFailed).
 */
export async function runAttempt(deps: ExecutorDeps, attempt: Attempt, settings: Settings, signal: AbortSignal): Promise<Outcome> {
  if (attempt.cancelRequested) return { kind: 'failed', answer: cancelledAnswer(), frames: null, cancelled: true, end: ended(null), ...NO_TRAFFIC };
  const backend = attempt.backend;
  if (!backend) {
    return transportFailure(attempt, settings, NO_TRAFFIC, new TransportError('The backend this request was routed to no longer exists.', { refused: true }));
  }
  const started = performance.now();
  // Traced, the call is a client span in the GenAI conventions (docs/operations.md "Tracing").
  const outcome = tracer === null
    ? await callProvider(deps, attempt, backend, settings, signal, null)
    : await traceProviderCall(tracer, { dialect: attempt.dialect, backendDialect: backend.dialect, model: attempt.model, address: backend.address }, async (call) => {
        const o = await callProvider(deps, attempt, backend, settings, signal, call);
        if (o.kind === 'succeeded' || o.kind === 'failed') call.tokens(o.tokens?.prompt ?? null, o.tokens?.completion ?? null);
        return o;
      });
  const tokens = outcome.kind === 'succeeded' || outcome.kind === 'failed' ? outcome.tokens : undefined;
  const errorType = outcome.kind === 'succeeded' ? null : 'end' in outcome ? (outcome.end.status === null ? 'transport' : String(outcome.end.status)) : outcome.kind;
  observeGenAiCall(OPERATION, providerName(backend.dialect), started, errorType, tokens?.prompt ?? null, tokens?.completion ?? null);
  return outcome;
}

async function callProvider(
  deps: ExecutorDeps, attempt: Attempt, backend: BackendForCall, settings: Settings, signal: AbortSignal, call: CallTrace | null,
): Promise<Outcome> {
  let res: UpstreamResponse;
  const sent: Sent = { reached: false, bytes: 0 };
  if (attempt.attempt === 1) observeAcceptanceToCall(idTime(attempt.id));
  const callStarted = performance.now();
  try {
    res = await deps.upstream.call(
      {
        dialect: attempt.dialect,
        address: backend.address,
        credential: attemptCredential(deps, attempt, backend),
        forwarded: attempt.forwardedHeaders,
        hops: attempt.hops,
        // Sarsen performs background mode itself: the provider never sees `background`.
        body: attempt.dialect === 'responses' ? upstreamBody(attempt.body) : attempt.body,
        streaming: attempt.streaming,
        signal,
        sent,
      },
      settings,
    );
  } catch (err) {
    observeProviderCall(backend.kind, null, callStarted);
    if (signal.aborted) return aborted(signal, traffic(sent, 0));
    return transportFailure(attempt, settings, traffic(sent, 0), describeTransportError(err));
  }
  observeProviderCall(backend.kind, res.status, callStarted);
  call?.answered(res.status);
  const contentType = header(res, 'content-type');
  const success = res.status >= 200 && res.status < 300;
  if (success && attempt.streaming && /^text\/event-stream\b/i.test(contentType ?? '')) {
    return runStream(deps, attempt, settings, signal, res, sent, call);
  }

  // A whole answer: a success, or a refusal with the provider's body byte for byte.
  let body: Buffer;
  try {
    body = await readAll(res.body, success ? MAX_ANSWER_BYTES : MAX_ERROR_BYTES);
  } catch (err) {
    res.body.destroy();
    if (signal.aborted) return aborted(signal, traffic(sent, 0));
    return transportFailure(attempt, settings, traffic(sent, 0), describeTransportError(err));
  }
  const moved = traffic(sent, body.length);
  if (success) {
    call?.answer(body);
    if (attempt.dialect === 'responses') await noteResponseId(deps, attempt, answerResponseId(body), settings);
    const answer: Answer = { status: 'succeeded', httpStatus: res.status, contentType, body, errorStatus: null, retryAfter: null };
    return { kind: 'succeeded', answer, tokens: tokensFromAnswer(attempt.dialect, body), frames: null, cacheable: true, end: ended(res.status), ...moved };
  }
  const retryAfter = header(res, 'retry-after');
  if (isRetryableStatus(res.status) && attempt.attempt < settings.max_attempts) {
    const retryAfterMs = retryAfter === null ? null : parseRetryAfter(retryAfter, Date.now());
    countRetry(res.status);
    return { kind: 'retry', delayMs: nextDelayMs({ attempt: attempt.attempt, baseMs: settings.retry_base_ms, maxMs: settings.retry_max_ms, retryAfterMs }), end: ended(res.status, retryAfter), ...moved };
  }
  // The provider's content type is kept for the record (a non-JSON body is wrapped beside it);
  // the dialect routes still pass the body through as application/json.
  const answer: Answer = { status: 'failed', httpStatus: res.status, contentType, body, errorStatus: res.status, retryAfter };
  return { kind: 'failed', answer, frames: null, end: ended(res.status, retryAfter), ...moved };
}

/**
 * A streamed answer: the provider's bytes split into frames byte-exactly, each numbered and
 * group-committed. A failure before the first frame is an ordinary (retryable) transport
 * failure; after it, the status line has been sent to live readers, so it is terminal.
 */
async function runStream(
  deps: ExecutorDeps, attempt: Attempt, settings: Settings, signal: AbortSignal, res: UpstreamResponse, sent: Sent, call: CallTrace | null,
): Promise<Outcome> {
  const framer = createFramer();
  const encode = createFrameEncoder();
  const tokens = createStreamTokenReader(attempt.dialect);
  let seq = attempt.firstSeq - 1;
  let received = 0;
  let storedBytes = 0; // of frames handed to the writer: all of them are committed before the outcome
  let providerFailed = false; // a frame was the provider's own failure event
  let whole = false; // a frame was the dialect's last event
  // Reading never waits for a commit: bytes left in the body's buffer while a flush is in
  // flight are discarded when the connection then fails (a destroyed stream drops its buffer),
  // so frames the provider did send would be lost. A store failure stops reading at once.
  const backlog = createCommitBacklog<LeaseLost | StoreFailed>(MAX_UNCOMMITTED, (failure) => res.body.destroy(failure));
  const store = (frames: Buffer[]): void => {
    if (frames.length === 0) return;
    if (seq < attempt.firstSeq && attempt.attempt === 1) observeFirstFrame(idTime(attempt.id));
    call?.frames(frames, seq + 1);
    const rows = frames.map((frame) => {
      tokens.push(frame);
      if (!providerFailed) providerFailed = isProviderFailureFrame(frame);
      if (!whole) whole = isStreamEndFrame(attempt.dialect, frame);
      storedBytes += frame.length;
      seq++;
      return { requestId: attempt.id, attempt: attempt.attempt, seq, frame, stored: encode(seq, frame) };
    });
    backlog.handed(rows.length);
    deps.chunks.write(rows).then(
      (stored) => {
        if (stored) call?.committed(rows.length);
        backlog.settled(rows.length, stored ? undefined : new LeaseLost('the lease was lost while streaming'));
      },
      (err) => backlog.settled(rows.length, new StoreFailed(err)),
    );
  };
  // A Responses stream's provider id is recorded before the frame carrying it is stored.
  let idFrames = attempt.dialect === 'responses' ? ID_FRAMES : 0;
  const withId = async (frames: Buffer[]): Promise<Buffer[]> => {
    for (let i = 0; idFrames > 0 && i < frames.length; i++, idFrames--) {
      const id = frameResponseId(frames[i]!);
      if (id !== null) {
        idFrames = 0;
        await noteResponseId(deps, attempt, id, settings);
      }
    }
    return frames;
  };
  try {
    for await (const chunk of res.body) {
      received += chunk.length;
      const frames = framer.push(chunk);
      store(idFrames > 0 ? await withId(frames) : frames);
      if (backlog.full()) await backlog.drained();
    }
    store(await withId(framer.end()));
    const storeFailure = await backlog.allSettled();
    if (storeFailure) throw storeFailure;
  } catch (caught) {
    const storeFailure = await backlog.allSettled();
    res.body.destroy();
    // Not the provider's failure: stop its call; the attempt is the attempt runner's to give up.
    if (storeFailure) throw storeFailure;
    const stored = seq < attempt.firstSeq ? null : { bytes: storedBytes, lastSeq: seq };
    if (signal.aborted) return aborted(signal, traffic(sent, received), stored, tokens.result());
    const failure = describeTransportError(caught);
    if (seq < attempt.firstSeq) return transportFailure(attempt, settings, traffic(sent, received), failure);
    logger.warn('stream failed after its first frame', { request_id: attempt.id, attempt: attempt.attempt, reason: failure.message });
    return { kind: 'failed', answer: transportAnswer(failure), frames: stored, end: ended(null, null, failure.message), ...traffic(sent, received) };
  }
  const answer: Answer = { status: 'succeeded', httpStatus: res.status, contentType: header(res, 'content-type'), body: Buffer.alloc(0), errorStatus: null, retryAfter: null };
  return {
    kind: 'succeeded', answer, tokens: tokens.result(), frames: { bytes: storedBytes, lastSeq: seq }, cacheable: whole && !providerFailed,
    end: ended(res.status), ...traffic(sent, received),
  };
}
