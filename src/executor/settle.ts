// Writing how an attempt ended, fenced on its attempt number, and telling this process's
// readers at once. Terminal writes are group-committed: every answer that arrives while the
// previous batch commits goes in the next statement, and once it commits, local waiters get
// the answer itself in memory (others hear the statement's NOTIFY). Retries and hand-backs
// are rare and written one by one.
import type { BaseDeps } from '../deps.ts';
import { createBatchPool, retryTransient } from '../db/pool.ts';
import { settleBatch, scheduleRetry, type Attempt, type Terminal } from '../db/attempts.ts';
import { handBack } from '../db/recovery.ts';
import { createBatcher, LINGER_TURNS, SPARE_LANE_AT, WRITER_LANES } from '../core/batcher.ts';
import type { Outcome } from './execute.ts';
import { logger } from '../log.ts';
import { countGroupCommit, countHandBack } from '../metrics/metrics.ts';
import { tracer } from '../telemetry/tracing.ts';
import { tracedFlush, traceSettle } from '../telemetry/spans.ts';

const MAX_BATCH = 500;
// A retry's job falls due by the database's clock; fetched a little after, it is due however the clocks differ by a hair.
const RETRY_FETCH_SLACK_MS = 50;

export type Settle = { settle(attempt: Attempt, outcome: Outcome): Promise<void>; close(): Promise<void> };

export function createSettle(deps: BaseDeps): Settle {
  const writer = createBatchPool(deps.conn, 'sarsen-terminals', WRITER_LANES);
  const terminals = createBatcher<Terminal, boolean>(
    async (batch, lane) => {
      countGroupCommit('terminals', lane);
      const opts = { metering: deps.settings.current().metering_enabled, origin: deps.processId };
      // Through an outage, for as long as the lease could last: the answer is in hand.
      const flush = () => retryTransient(() => settleBatch(writer, batch, opts), deps.settings.current().lease_ms);
      const written = await (tracer === null ? flush() : tracedFlush('settle:', batch.map((terminal) => terminal.id), lane, flush));
      return batch.map((terminal) => written.has(terminal.id));
    },
    { maxBatch: MAX_BATCH, lanes: WRITER_LANES, spareAt: SPARE_LANE_AT, linger: LINGER_TURNS },
  );

  const settle = (attempt: Attempt, outcome: Outcome): Promise<void> =>
    tracer === null ? settleOne(attempt, outcome) : traceSettle(tracer, attempt.id, outcome.kind, () => settleOne(attempt, outcome));

  const settleOne = async (attempt: Attempt, outcome: Outcome): Promise<void> => {
    const log = { request_id: attempt.id, attempt: attempt.attempt };
    switch (outcome.kind) {
      case 'succeeded':
      case 'failed': {
        const tokens = outcome.tokens ?? { prompt: null, completion: null, total: null };
        const { answer, reached, sentBytes, receivedBytes, frames, end } = outcome;
        const cancelled = outcome.kind === 'failed' && outcome.cancelled === true;
        const written = await terminals.add({
          id: attempt.id, attempt: attempt.attempt, model: attempt.model, answer, tokens, frames, reached, sentBytes, receivedBytes, cancelled, end,
          ownCredential: attempt.sealedCredential !== null, tokenLimited: attempt.tokenLimited, cacheable: outcome.kind === 'succeeded' && outcome.cacheable,
        });
        if (written) deps.bus.publishRequest({ type: 'state', requestId: attempt.id, status: answer.status, answer });
        else logger.warn('answer discarded: lease lost before it was stored', log);
        return;
      }
      case 'retry': {
        const scheduled = await retryTransient(() => scheduleRetry(deps.pool, { ...outcome, id: attempt.id, attempt: attempt.attempt, origin: deps.processId }), deps.settings.current().lease_ms);
        if (!scheduled) return;
        // graphile-worker polls only as a backstop: this process fetches the retry when it falls due.
        setTimeout(() => deps.bus.publishLocal({ k: 'jobs', count: 1 }), outcome.delayMs + RETRY_FETCH_SLACK_MS).unref();
        deps.bus.publishRequest({ type: 'state', requestId: attempt.id, status: 'pending' });
        logger.info('attempt failed; retry scheduled', { ...log, delay_ms: outcome.delayMs });
        return;
      }
      case 'handed_back': {
        // Another executor takes over at once instead of waiting for the lease to expire (if
        // the database is still unreachable, the sweep recovers the attempt once it expires).
        const handed = await retryTransient(() => handBack(deps.pool, attempt.id, attempt.attempt, deps.processId)).catch(() => false);
        if (handed) deps.bus.publishRequest({ type: 'superseded', requestId: attempt.id });
        if (handed) countHandBack(outcome.reason === 'shutdown' ? 'shutdown' : 'database');
        logger.warn('attempt handed back', { ...log, handed, reason: outcome.reason, ...(outcome.cause ? { cause: outcome.cause } : {}) });
        return;
      }
      case 'lease_lost':
        logger.warn('attempt abandoned: lease lost', log);
    }
  };
  return { settle, close: () => writer.end() };
}
