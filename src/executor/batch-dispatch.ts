// The batch dispatcher (docs/api.md "Batches"; docs/durability.md "Batches"). Every executor
// process runs this loop; one at a time does the work (a transaction-scoped advisory lock). Each
// round, in one transaction: lines past their batch's window expire, and waiting lines are
// handed to the queue as ordinary requests (the submission statement: identity, ledger,
// counters, rate limits, job) until `batch_lines_in_flight` lines are in flight across the
// deployment (lines whose request has not ended), so the executors' other slots stay with
// interactive traffic. A key over its rate limit pauses its batch for the Retry-After the
// statement gave. A line a rule refuses ends as that line, with the code Sarsen would have
// answered. A batch whose every line ended is finalized: its files are sized from its lines.
import type { BaseDeps } from '../deps.ts';
import { withTransaction, connectionFailed } from '../db/pool.ts';
import {
  anyActiveBatch, tryDispatchLock, expireLines, pickWaitingLines, markLines, pauseBatch, finalizingBatches, endBatch, resultPages, setLineBytes, withSavepoint,
  type WaitingLine, type LineOutcome, type Vendor,
} from '../db/batches.ts';
import { submitBatch, submitMeteredIn, isRefused, MeteringRefusal, type NewRequest } from '../db/submissions.ts';
import { routedRequest } from '../control/routed-request.ts';
import { ERROR_CODES, ServiceError } from '../core/errors.ts';
import { openaiFileOf, openaiLineBytes } from '../core/batch-shapes.ts';
import type { LineRefusal } from '../core/batch-lines.ts';
import { startLoop, type Loop } from './loop.ts';

// How soon the next round runs: soon after lines moved; while lines are in flight and none
// moved (they wait on the provider, or yield to acceptance), twice as late each round up to the
// idle pace, so a waiting batch does not poll the database 50 times a second.
const BUSY_MS = 20;
const IDLE_MS = 250;
// With no batch active, the dispatcher sleeps until a new batch's NOTIFY (migration 030) or a
// reconnect of the bus (which may have lost one) wakes it; this slow look is only a backstop.
const NO_BATCH_MS = 30_000;

/** What a round saw. */
type Round = { moved: boolean; inFlight: boolean };

const refusal = (err: ServiceError | MeteringRefusal): LineRefusal =>
  err instanceof ServiceError ? { code: err.code, status: err.status, message: err.message } : { code: err.reason, status: ERROR_CODES[err.reason].status, message: err.message };

/**
 * A waiting line as the request it becomes, through the one path a submission route takes too
 * (control/routed-request.ts), or the refusal Sarsen would have answered its body with.
 */
async function lineRequest(deps: BaseDeps, l: WaitingLine): Promise<NewRequest | LineRefusal> {
  // A line runs with its batch's key: once that key is revoked, its remaining lines are refused as its calls would be.
  if (l.key_revoked) return refusal(new ServiceError('unauthorised', 'The batch\'s API key was revoked before this line ran.'));
  const limited = l.requests_per_minute !== null || l.tokens_per_minute !== null;
  try {
    const { backend: _, ...routed } = await routedRequest(
      deps,
      {
        tenancyId: l.tenancy_id, namespaceId: l.namespace_id, apiKeyId: l.api_key_id, dialect: l.dialect, model: l.model, text: l.body, value: null, streaming: false,
        limits: limited ? { requestsPerMinute: l.requests_per_minute, tokensPerMinute: l.tokens_per_minute } : null,
      },
      { namespace: 'this namespace', speaker: 'this batch', synchronous: false, credential: null },
    );
    return { ...routed, forwardedHeaders: [], hops: 0, owner: null, precounted: false, cache: null };
  } catch (err) {
    if (err instanceof ServiceError) return refusal(err);
    throw err;
  }
}

/** One round inside the dispatch lock. */
async function round(deps: BaseDeps): Promise<Round> {
  return withTransaction(deps.pool, async (c) => {
    if (!(await tryDispatchLock(c))) return { moved: false, inFlight: false };
    const flight = await expireLines(c);
    const free = deps.settings.current().batch_lines_in_flight - flight.inFlight;
    if (free <= 0) return { moved: flight.expired > 0, inFlight: true };
    const waiting = await pickWaitingLines(c, free);
    const outcomes: LineOutcome[] = [];
    const submitted: { line: WaitingLine; request: NewRequest }[] = [];
    for (const line of waiting) {
      const made = await lineRequest(deps, line);
      if ('id' in made) submitted.push({ line, request: made });
      else outcomes.push({ batchId: line.batch_id, line: line.line, refusal: made });
    }
    const s = deps.settings.current();
    const submitSettings = { windowMs: s.idempotency_window_ms, feeMicros: s.request_fee_micros, leaseMs: s.lease_ms };
    let answers: Awaited<ReturnType<typeof submitBatch>> = [];
    if (!s.metering_enabled) {
      if (submitted.length > 0) answers = await submitBatch(c, submitted.map((x) => x.request), submitSettings);
    } else {
      // Metering checks credit and caps per submission: one line at a time, a refusal failing that line alone.
      for (const { line, request } of submitted) {
        try {
          answers.push(await withSavepoint(c, () => submitMeteredIn(c, request, submitSettings)));
        } catch (err) {
          if (!(err instanceof MeteringRefusal)) throw err;
          answers.push(null);
          outcomes.push({ batchId: line.batch_id, line: line.line, refusal: refusal(err) });
        }
      }
    }
    const paused = new Map<string, number>();
    answers.forEach((answer, i) => {
      const { line } = submitted[i]!;
      if (answer === null) return; // an identical body's claim committed meanwhile: next round lands on it
      // The key is over its rate limit: the line waits, and its batch with it.
      if (isRefused(answer)) paused.set(line.batch_id, Math.max(paused.get(line.batch_id) ?? 0, answer.retryAfterSeconds));
      else outcomes.push({ batchId: line.batch_id, line: line.line, requestId: answer.requestId });
    });
    for (const [id, seconds] of paused) await pauseBatch(c, id, seconds);
    await markLines(c, outcomes);
    return { moved: flight.expired + outcomes.length > 0, inFlight: flight.inFlight > 0 };
  });
}

/**
 * Ends a finalizing batch. An OpenAI batch's output and error files are its lines, each in the
 * file its end put it in (src/core/batch-shapes.ts): each line's size there is recorded, as
 * written now and as written once retention sweeps its answer, so a file's `bytes` is what it holds.
 */
async function finalize(deps: BaseDeps, b: { id: string; vendor: Vendor; tenancy_id: string; namespace_id: string }): Promise<void> {
  const has = { output: false, error: false };
  if (b.vendor === 'openai') {
    for await (const page of resultPages(deps.pool, b.id)) {
      for (const l of page) has[openaiFileOf(l)] = true;
      await setLineBytes(deps.pool, b.id, page.map((l) => ({ line: l.line, ...openaiLineBytes(b.id, l) })));
    }
  }
  const fileId = (kind: string) => `file-${b.id.replace(/^batch_/, '')}${kind}`;
  await endBatch(deps.pool, { id: b.id, tenancyId: b.tenancy_id, namespaceId: b.namespace_id }, {
    output: has.output ? fileId('OUT') : null,
    error: has.error ? fileId('ERR') : null,
  });
}

export function startBatchDispatcher(deps: BaseDeps): Loop {
  // Busy while lines move; backing off to idle while lines only wait on their requests.
  let pace = IDLE_MS;
  const next = (seen: Round) => (pace = seen.moved ? BUSY_MS : seen.inFlight ? Math.min(pace * 2, IDLE_MS) : IDLE_MS);
  const loop = startLoop(
    async () => {
      if (!(await anyActiveBatch(deps.pool))) return NO_BATCH_MS;
      const seen = await round(deps);
      for (const b of await finalizingBatches(deps.pool)) await finalize(deps, b);
      return next(seen);
    },
    {
      firstDelayMs: 0,
      failed: (err) => {
        connectionFailed('batch dispatch failed; will try again', err);
        return next({ moved: false, inFlight: false });
      },
    },
  );
  const unsubscribe = deps.bus.subscribe('batch', () => loop.wake());
  const unReconnect = deps.bus.onReconnect(() => loop.wake());
  return {
    wake: () => loop.wake(),
    stop() {
      unsubscribe();
      unReconnect();
      return loop.stop();
    },
  };
}
