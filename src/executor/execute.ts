// One attempt at a request: claim it under a lease, call the provider, record the outcome.
// Every write after the claim is fenced on the attempt number; a heartbeat that finds the
// lease gone aborts the provider call, so a zombie neither writes nor keeps spending tokens.
import { z } from 'zod';
import type { Deps } from '../deps.ts';
import type { Settings } from '../config/settings.ts';
import * as requests from '../db/requests.ts';
import type { ClaimedAttempt } from '../db/requests.ts';
import * as backends from '../db/backends.ts';
import * as recovery from '../db/recovery.ts';
import { retryOnConnectionLoss, isConnectionLoss } from '../db/pool.ts';
import { openBackendCredential } from '../control/backends.ts';
import { open } from '../core/sealing.ts';
import { tokensFromAnswer, createStreamTokenReader } from '../core/tokens.ts';
import { createFramer } from '../core/sse-framer.ts';
import type { ChunkWriter } from './chunk-writer.ts';
import { isRetryableStatus, parseRetryAfter, nextDelayMs } from '../core/retry.ts';
import { errorBody } from '../core/errors.ts';
import { TransportError, describeTransportError, type Upstream, type UpstreamResponse } from './upstream.ts';
import { logger, errorFields } from '../log.ts';

// Every write of an attempt is fenced or a claim, so one more try after a lost connection is
// safe (see retryOnConnectionLoss); a second loss leaves the attempt to the recovery sweep.
const retrying =
  <A extends unknown[], R>(fn: (...args: A) => Promise<R>) =>
  (...args: A): Promise<R> =>
    retryOnConnectionLoss(() => fn(...args));
const claimAttempt = retrying(requests.claimAttempt);
const renewLease = retrying(requests.renewLease);
const finishSucceeded = retrying(requests.finishSucceeded);
const finishFailed = retrying(requests.finishFailed);
const scheduleRetry = retrying(requests.scheduleRetry);
const loadBackendForCall = retrying(backends.loadBackendForCall);
const handBack = retrying(recovery.handBack);

// A JSON answer larger than this is refused rather than held in memory.
const MAX_ANSWER_BYTES = 64 * 1024 * 1024;
const MAX_ERROR_BYTES = 1024 * 1024;
// Frames of one stream handed to the chunk writer and not yet committed before reading pauses.
const MAX_UNCOMMITTED = 1024;

export const payloadSchema = z.object({ request_id: z.string().startsWith('req_') });

/** An attempt in flight in this process, so a stopping process can hand it back. */
export type ActiveAttempt = { id: string; attempt: number; controller: AbortController };

export type ExecutorDeps = Deps & { upstream: Upstream; owner: string; chunks: ChunkWriter; active: Set<ActiveAttempt> };

class LeaseLost extends Error {
  override name = 'LeaseLost';
}

/** The backend's own credential, or for a caller-credential backend the one this request brought. */
function attemptCredential(deps: ExecutorDeps, a: ClaimedAttempt, backend: backends.BackendForCall): string | null {
  if (backend.credential_source !== 'caller') return openBackendCredential(deps.keyring, backend);
  if (!a.sealedCredential) throw new TransportError('The caller credential of this request is no longer held.', { refused: true });
  return open(deps.keyring, a.sealedCredential, a.id);
}

/** Storing a frame failed (the database, not the provider): the attempt cannot go on here. */
class StoreFailed extends Error {
  override name = 'StoreFailed';
  constructor(cause: unknown) {
    super('storing a stream frame failed', { cause });
  }
}

/** The abort reason a stopping process gives attempts that could not finish within its grace. */
export class HandBack extends Error {
  override name = 'HandBack';
}

export async function executeRequest(deps: ExecutorDeps, requestId: string): Promise<void> {
  const settings = deps.settings.current();
  const attempt = await claimAttempt(deps.pool, requestId, deps.owner, settings.lease_ms);
  if (!attempt) return; // already settled, or another worker holds it
  const controller = new AbortController();
  const active: ActiveAttempt = { id: attempt.id, attempt: attempt.attempt, controller };
  deps.active.add(active);
  const heartbeat = setInterval(() => {
    renewLease(deps.pool, attempt.id, attempt.attempt, settings.lease_ms).then(
      (held) => {
        if (!held) controller.abort(new LeaseLost('the lease was lost'));
      },
      (err) => logger.warn('lease renewal failed', { request_id: attempt.id, ...errorFields(err) }),
    );
  }, settings.heartbeat_ms);
  try {
    await runAttempt(deps, attempt, settings, controller.signal);
  } catch (err) {
    const stopping = controller.signal.aborted && controller.signal.reason instanceof HandBack;
    if (stopping || isConnectionLoss(err)) {
      // Another executor takes over at once instead of waiting for the lease to expire (if
      // the database is still unreachable, the sweep recovers the attempt once it expires).
      controller.abort(err);
      const handed = await handBack(deps.pool, attempt.id, attempt.attempt).catch(() => false);
      if (handed) deps.bus.publishLocal({ k: `req:${attempt.id}`, s: 'superseded' });
      logger.warn('attempt handed back', { request_id: attempt.id, attempt: attempt.attempt, handed, reason: stopping ? 'shutdown' : 'database connection lost' });
      return;
    }
    if (err instanceof LeaseLost || (controller.signal.aborted && controller.signal.reason instanceof LeaseLost)) {
      controller.abort(err); // stop the provider call: a zombie must not keep spending tokens
      logger.warn('attempt abandoned: lease lost', { request_id: attempt.id, attempt: attempt.attempt });
      return;
    }
    throw err;
  } finally {
    clearInterval(heartbeat);
    deps.active.delete(active);
  }
}

async function readAll(body: AsyncIterable<Buffer>, limit: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += chunk.length;
    if (size > limit) throw new TransportError(`The provider's answer is larger than ${limit} bytes.`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks, size);
}

function header(res: UpstreamResponse, name: string): string | null {
  const v = res.headers[name];
  if (v === undefined) return null;
  return Array.isArray(v) ? v.join(', ') : v;
}

async function runAttempt(deps: ExecutorDeps, a: ClaimedAttempt, settings: Settings, signal: AbortSignal): Promise<void> {
  const log = { request_id: a.id, attempt: a.attempt };
  const backend = await loadBackendForCall(deps.pool, a.backendId);
  if (!backend) {
    await fail(deps, a, 0, new TransportError('The backend this request was routed to no longer exists.', { refused: true }));
    return;
  }
  let sentBytes = 0;
  let res: UpstreamResponse;
  try {
    res = await deps.upstream.call(
      {
        dialect: a.dialect,
        address: backend.address,
        credential: attemptCredential(deps, a, backend),
        forwarded: a.forwardedHeaders,
        hops: a.hops,
        body: a.body,
        streaming: a.streaming,
        signal,
      },
      settings,
    );
    sentBytes = res.sentBytes;
  } catch (err) {
    if (signal.aborted) throw err;
    await transportFailure(deps, a, settings, Buffer.byteLength(a.body), describeTransportError(err));
    return;
  }

  const contentType = header(res, 'content-type');
  if (res.status >= 200 && res.status < 300 && a.streaming && /^text\/event-stream\b/i.test(contentType ?? '')) {
    await runStream(deps, a, settings, signal, res, sentBytes);
    return;
  }

  if (res.status >= 200 && res.status < 300) {
    let body: Buffer;
    try {
      body = await readAll(res.body, MAX_ANSWER_BYTES);
    } catch (err) {
      if (signal.aborted) throw err;
      res.body.destroy();
      await transportFailure(deps, a, settings, sentBytes, describeTransportError(err));
      return;
    }
    const stored = await finishSucceeded(deps.pool, {
      id: a.id,
      attempt: a.attempt,
      status: res.status,
      contentType,
      body,
      tokens: tokensFromAnswer(a.dialect, body),
      metering: settings.metering_enabled,
      sentBytes,
      receivedBytes: body.length,
    });
    if (stored) deps.bus.publishLocal({ k: `req:${a.id}`, s: 'succeeded' });
    else logger.warn('answer discarded: lease lost before it was stored', log);
    return;
  }

  // An HTTP answer that is not a success: the provider's body, byte for byte.
  let body: Buffer;
  try {
    body = await readAll(res.body, MAX_ERROR_BYTES);
  } catch (err) {
    if (signal.aborted) throw err;
    res.body.destroy();
    await transportFailure(deps, a, settings, sentBytes, describeTransportError(err));
    return;
  }
  const retryAfter = header(res, 'retry-after');
  if (isRetryableStatus(res.status) && a.attempt < settings.max_attempts) {
    const retryAfterMs = retryAfter === null ? null : parseRetryAfter(retryAfter, Date.now());
    await retry(deps, a, settings, retryAfterMs, sentBytes, body.length);
    return;
  }
  const stored = await finishFailed(deps.pool, {
    id: a.id,
    attempt: a.attempt,
    errorStatus: res.status,
    retryAfter,
    body,
    sentBytes,
    receivedBytes: body.length,
  });
  if (stored) deps.bus.publishLocal({ k: `req:${a.id}`, s: 'failed' });
}

async function retry(
  deps: ExecutorDeps,
  a: ClaimedAttempt,
  settings: Settings,
  retryAfterMs: number | null,
  sentBytes: number,
  receivedBytes: number,
): Promise<void> {
  const delayMs = nextDelayMs({ attempt: a.attempt, baseMs: settings.retry_base_ms, maxMs: settings.retry_max_ms, retryAfterMs });
  const scheduled = await scheduleRetry(deps.pool, { id: a.id, attempt: a.attempt, delayMs, sentBytes, receivedBytes });
  if (scheduled) logger.info('attempt failed; retry scheduled', { request_id: a.id, attempt: a.attempt, delay_ms: delayMs });
}

async function transportFailure(deps: ExecutorDeps, a: ClaimedAttempt, settings: Settings, sentBytes: number, err: TransportError) {
  logger.warn('provider call failed', { request_id: a.id, attempt: a.attempt, reason: err.message });
  if (!err.refused && a.attempt < settings.max_attempts) {
    await retry(deps, a, settings, null, sentBytes, 0);
    return;
  }
  await fail(deps, a, sentBytes, err);
}

async function fail(deps: ExecutorDeps, a: ClaimedAttempt, sentBytes: number, err: TransportError, receivedBytes = 0): Promise<void> {
  const stored = await finishFailed(deps.pool, {
    id: a.id,
    attempt: a.attempt,
    errorStatus: null,
    retryAfter: null,
    body: Buffer.from(errorBody('upstream_failed', err.message)),
    sentBytes,
    receivedBytes,
  });
  if (stored) deps.bus.publishLocal({ k: `req:${a.id}`, s: 'failed' });
}

/**
 * A streamed answer: the provider's bytes split into frames byte-exactly, each numbered and
 * group-committed. A failure before the first frame is an ordinary (retryable) transport
 * failure; after it, the status line has been sent to live readers, so it is terminal.
 */
async function runStream(
  deps: ExecutorDeps,
  a: ClaimedAttempt,
  settings: Settings,
  signal: AbortSignal,
  res: UpstreamResponse,
  sentBytes: number,
): Promise<void> {
  const framer = createFramer();
  const tokens = createStreamTokenReader(a.dialect);
  let seq = a.firstSeq - 1;
  let received = 0;
  // Reading never waits for a commit: bytes left in the body's buffer while a flush is in
  // flight are discarded when the connection then fails (a destroyed stream drops its buffer),
  // so frames the provider did send would be lost. Outcomes are written only once every frame
  // handed to the writer has settled; a backlog past MAX_UNCOMMITTED pauses reading.
  let uncommitted = 0;
  let storeError: LeaseLost | StoreFailed | null = null;
  const waiters = new Set<() => void>();
  const settleOne = () => {
    uncommitted--;
    for (const w of waiters) w();
  };
  const atMost = (n: number) =>
    new Promise<void>((resolve) => {
      const check = () => {
        if (uncommitted > n) return;
        waiters.delete(check);
        resolve();
      };
      waiters.add(check);
      check();
    });
  const failStore = (err: LeaseLost | StoreFailed) => {
    storeError ??= err;
    res.body.destroy(storeError); // stop reading at once; the loop below sees storeError
  };
  const store = (frames: Buffer[]): void => {
    for (const frame of frames) {
      tokens.push(frame);
      uncommitted++;
      deps.chunks.write({ requestId: a.id, attempt: a.attempt, seq: ++seq, frame }).then(
        (stored) => {
          if (!stored) failStore(new LeaseLost('the lease was lost while streaming'));
          settleOne();
        },
        (err) => {
          failStore(new StoreFailed(err));
          settleOne();
        },
      );
    }
  };
  try {
    for await (const chunk of res.body) {
      received += chunk.length;
      store(framer.push(chunk));
      if (uncommitted > MAX_UNCOMMITTED) await atMost(MAX_UNCOMMITTED / 2);
    }
    store(framer.end());
    await atMost(0);
    if (storeError) throw storeError;
  } catch (caught) {
    await atMost(0);
    const err = storeError ?? caught;
    if (err instanceof LeaseLost || err instanceof StoreFailed || signal.aborted) {
      // Not the provider's failure: stop its call; the attempt is the recovery sweep's now.
      res.body.destroy();
      throw err instanceof StoreFailed ? err.cause : err instanceof LeaseLost ? err : signal.reason ?? err;
    }
    res.body.destroy();
    const failure = describeTransportError(err);
    if (seq < a.firstSeq) {
      await transportFailure(deps, a, settings, sentBytes, failure);
      return;
    }
    logger.warn('stream failed after its first frame', { request_id: a.id, attempt: a.attempt, reason: failure.message });
    await fail(deps, a, sentBytes, failure, received);
    return;
  }
  const stored = await finishSucceeded(deps.pool, {
    id: a.id,
    attempt: a.attempt,
    status: res.status,
    contentType: header(res, 'content-type'),
    body: Buffer.alloc(0),
    tokens: tokens.result(),
    metering: settings.metering_enabled,
    sentBytes,
    receivedBytes: received,
  });
  if (stored) deps.bus.publishLocal({ k: `req:${a.id}`, s: 'succeeded' });
}
