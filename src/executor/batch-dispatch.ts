// The batch dispatcher (docs/api.md "Batches"; docs/durability.md "Batches"). Every executor
// process runs this loop; one at a time does the work (a transaction-scoped advisory lock). Each
// round, in one transaction: lines whose request ended take its end, lines past their batch's
// window expire, and waiting lines are handed to the queue as ordinary requests (the submission
// statement: identity, ledger, counters, rate limits, job) until `batch_lines_in_flight` lines
// are in flight across the deployment, so the executors' other slots stay with interactive
// traffic. A key over its rate limit pauses its batch for the Retry-After the statement gave.
// A line a rule refuses ends as that line, with the code Sarsen would have answered. A batch
// whose every line ended is finalized: its output and error files are sized from the answers.
import type { BaseDeps, Deps } from '../deps.ts';
import { withTransaction, connectionFailed } from '../db/pool.ts';
import {
  anyActiveBatch, tryDispatchLock, settleLines, pickWaitingLines, markLines, pauseBatch, finalizingBatches, endBatch, resultPage, withSavepoint,
  type WaitingLine, type LineOutcome, type Vendor,
} from '../db/batches.ts';
import { submitBatch, submitMeteredIn, isRefused, MeteringRefusal, type NewRequest } from '../db/submissions.ts';
import { resolveModel } from '../control/resolve-model.ts';
import { servesDialect } from '../core/dialects.ts';
import { identityHash, parseCanonical, withTopLevelField, jsonString } from '../core/canonical-json.ts';
import { newId } from '../core/ids.ts';
import { ERROR_CODES, type ErrorCode } from '../core/errors.ts';
import { openaiResultLine, succeeded } from '../core/batch-shapes.ts';
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
const PAGE = 500;

const refusal = (code: ErrorCode, message: string) => ({ code, status: ERROR_CODES[code].status, message });

/** A waiting line as the request it becomes, or the refusal Sarsen would have answered its body with. */
async function lineRequest(deps: BaseDeps, l: WaitingLine): Promise<NewRequest | { code: string; status: number; message: string }> {
  // A line runs with its batch's key: once that key is revoked, its remaining lines are refused as its calls would be.
  if (l.key_revoked) return refusal('unauthorised', 'The batch\'s API key was revoked before this line ran.');
  const resolution = await resolveModel(deps as Deps, l.namespace_id, l.model);
  if (resolution === null) return refusal('not_found', `No routing rule matches model ${JSON.stringify(l.model)} in this namespace.`);
  if ('declined' in resolution) return refusal('forbidden', `Routing rule ${resolution.declined.rule_id} (${resolution.declined.model}) declines model ${JSON.stringify(l.model)}.`);
  const { rule, backend } = resolution;
  if (!servesDialect(backend.dialect, l.dialect)) {
    return refusal('unprocessable_entity', `Model ${JSON.stringify(l.model)} routes to a ${backend.dialect}-dialect backend; this batch speaks ${l.dialect}. Sarsen does not translate between dialects.`);
  }
  if (backend.credential_source === 'caller') return refusal('passthrough_disabled', 'This model routes to a caller-credential backend, which takes synchronous submissions only.');
  const upstreamModel = rule.rewrite_model ?? l.model;
  const body = upstreamModel === l.model ? l.body : withTopLevelField(parseCanonical(l.body).value, 'model', jsonString(upstreamModel));
  const limited = l.requests_per_minute !== null || l.tokens_per_minute !== null;
  return {
    id: newId('req'),
    tenancyId: l.tenancy_id,
    namespaceId: l.namespace_id,
    apiKeyId: l.api_key_id,
    backendId: backend.backend_id,
    fallbackBackendIds: rule.fallback_backend_ids,
    dialect: l.dialect,
    streaming: false,
    model: l.model,
    upstreamModel,
    forwardedHeaders: [],
    hops: 0,
    body,
    identity: Buffer.from(identityHash({ dialect: l.dialect, canonicalText: l.body }), 'hex'),
    sealedCredential: null,
    owner: null,
    limits: limited ? { requestsPerMinute: l.requests_per_minute, tokensPerMinute: l.tokens_per_minute } : null,
    precounted: false,
    cache: null,
  };
}

/** One round inside the dispatch lock. */
async function round(deps: BaseDeps): Promise<Round> {
  return withTransaction(deps.pool, async (c) => {
    if (!(await tryDispatchLock(c))) return { moved: false, inFlight: false };
    const settled = await settleLines(c);
    const free = deps.settings.current().batch_lines_in_flight - settled.inFlight;
    if (free <= 0) return { moved: settled.settled + settled.expired > 0, inFlight: true };
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
          outcomes.push({ batchId: line.batch_id, line: line.line, refusal: refusal(err.reason, err.message) });
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
    return { moved: settled.settled + settled.expired + outcomes.length > 0, inFlight: settled.inFlight > 0 };
  });
}

/** Sizes a finalizing batch's output and error files from its lines' answers, and ends it. */
async function finalize(deps: BaseDeps, b: { id: string; vendor: Vendor; tenancy_id: string; namespace_id: string }): Promise<void> {
  let output = 0;
  let errors = 0;
  let outputBytes = 0;
  let errorBytes = 0;
  if (b.vendor === 'openai') {
    for (let after = 0; ; ) {
      const page = await resultPage(deps.pool, b.id, after, PAGE);
      for (const l of page) {
        const bytes = Buffer.byteLength(openaiResultLine(b.id, l));
        if (succeeded(l)) (output++, (outputBytes += bytes));
        else (errors++, (errorBytes += bytes));
      }
      if (page.length < PAGE) break;
      after = page.at(-1)!.line;
    }
  }
  const fileId = (kind: string) => `file-${b.id.replace(/^batch_/, '')}${kind}`;
  await endBatch(deps.pool, { id: b.id, tenancyId: b.tenancy_id, namespaceId: b.namespace_id }, {
    output: output > 0 ? { id: fileId('OUT'), bytes: outputBytes } : null,
    error: errors > 0 ? { id: fileId('ERR'), bytes: errorBytes } : null,
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
