// Accepting submissions, group-committed per process: every submission that arrives while the
// previous batch commits goes into the next statement (src/db/submissions.ts), so a request
// costs a share of one commit. A process that also executes (role both) claims what it accepts
// in that same statement while it has a free slot, and its executor starts the provider call
// as soon as the batch commits (docs/durability.md "Run where accepted"); the rest wait as jobs
// for any executor.
import { createBatchPool, retryTransient, type ConnectionConfig, type Pool } from '../../db/pool.ts';
import type { Settings, SettingsCache } from '../../config/settings.ts';
import { submitBatch, submitMetered, isRefused, type NewRequest, type Submitted, type SubmitSettings } from '../../db/submissions.ts';
import { RateLimitRefusal, type Refused } from '../../db/rate-limits.ts';
import { acceptedAttempt } from '../../db/attempts.ts';
import type { NewSubmission, RunWhereAccepted, Submitter } from '../../deps.ts';
import { countGroupCommit } from '../../metrics/metrics.ts';
import { createBatcher, LINGER_TURNS, SPARE_LANE_AT, WRITER_LANES } from '../../core/batcher.ts';
import { tracer } from '../../telemetry/tracing.ts';
import { tracedFlush } from '../../telemetry/spans.ts';

// Bound on one statement's parameters.
const MAX_BATCH = 500;
// How long a submission rides out a lost database before it is answered 503 unavailable.
const OUTAGE_PATIENCE_MS = 1000;

const submitSettings = (settings: Settings): SubmitSettings => ({
  windowMs: settings.idempotency_window_ms,
  feeMicros: settings.request_fee_micros,
  leaseMs: settings.lease_ms,
});

/**
 * `pool` serves metered submissions (each its own transaction); batches have a connection of
 * their own. `runWhereAccepted`: null in a process that does not execute.
 */
export function createSubmitter(conn: ConnectionConfig, pool: Pool, settings: SettingsCache, runWhereAccepted: RunWhereAccepted | null): Submitter {
  const writer = createBatchPool(conn, 'sarsen-submissions', WRITER_LANES);
  const batches = createBatcher<NewRequest, Submitted | Refused | null>(
    (batch, lane) => {
      countGroupCommit('submissions', lane);
      const flush = () => retryTransient(() => submitBatch(writer, batch, submitSettings(settings.current())), OUTAGE_PATIENCE_MS);
      return tracer === null ? flush() : tracedFlush('accept:', batch.map((r) => r.id), lane, flush);
    },
    { maxBatch: MAX_BATCH, lanes: WRITER_LANES, spareAt: SPARE_LANE_AT, linger: LINGER_TURNS },
  );
  // A repeat after a lost connection finds what the first try committed (see submitBatch).
  const commitOnce = (request: NewRequest): Promise<Submitted | Refused | null> => {
    const current = settings.current();
    return current.metering_enabled ? retryTransient(() => submitMetered(pool, request, submitSettings(current)), OUTAGE_PATIENCE_MS) : batches.add(request);
  };

  // Commits one submission; `owner`: claim it for this process should it start an execution.
  const commit = async (submission: NewSubmission, owner: string | null): Promise<Submitted> => {
    for (let precounted = false; ; precounted = true) {
      const submitted = await commitOnce({ ...submission, owner, precounted });
      // Null: an identical body's claim was committed meanwhile; the next try lands on it
      // (its key's window counted it already: the statement that could not place it committed).
      if (submitted === null) continue;
      if (isRefused(submitted)) throw new RateLimitRefusal(submitted);
      return submitted;
    }
  };

  return {
    async submit(submission) {
      // Run where accepted: while this process has a free slot, the commit claims for it.
      const owner = runWhereAccepted === null ? null : runWhereAccepted.reserve();
      if (runWhereAccepted === null || owner === null) return commit(submission, null);
      let submitted: Submitted;
      try {
        submitted = await commit(submission, owner);
      } catch (err) {
        runWhereAccepted.start(null, { callerWaits: true }); // nothing claimed: the slot is free again
        throw err;
      }
      // It claimed only an execution it started: one it attached to, or the cache answered, is not this slot's.
      const claimed = submitted.attached || submitted.cachedFrom !== null ? null : acceptedAttempt(submission);
      runWhereAccepted.start(claimed, { callerWaits: submission.callerWaits });
      return submitted;
    },
    close: () => writer.end(),
  };
}
