// Accepting submissions, group-committed per process: every submission that arrives while the
// previous batch commits goes into the next statement (src/db/submissions.ts), so a request
// costs a share of one commit. A process that also executes (role both) claims what it accepts
// in that same statement, while it has a free slot, and starts the provider call as soon as
// the batch commits; the rest wait as jobs for any executor.
import { createBatchPool, retryTransient, type ConnectionConfig, type Pool } from '../../db/pool.ts';
import type { Settings, SettingsCache } from '../../config/settings.ts';
import { submitBatch, submitMetered, type NewRequest, type Submitted, type SubmitSettings } from '../../db/submissions.ts';
import type { Attempt } from '../../db/attempts.ts';
import type { BackendForCall } from '../../db/backends.ts';
import { createBatcher, SPARE_LANE_AT } from '../../core/batcher.ts';
import { WRITER_SHARD } from '../../db/counters.ts';

// Bound on one statement's parameters.
const MAX_BATCH = 500;
// How long a submission rides out a lost database before it is answered 503 unavailable.
const OUTAGE_PATIENCE_MS = 1000;

/** The executor of this process, as acceptance sees it (src/executor/runner.ts). */
export type LocalRunner = {
  readonly owner: string;
  reserve(): boolean;
  release(): void;
  run(a: Attempt, opts: { background: boolean }): void;
};

export type Submission = Omit<NewRequest, 'owner'> & {
  backend: BackendForCall;
  /** A caller waits for the answer (not POST /requests). */
  waited: boolean;
};

export type Submitter = { submit(s: Submission): Promise<Submitted>; close(): Promise<void> };

const submitSettings = (s: Settings): SubmitSettings => ({ windowMs: s.idempotency_window_ms, feeMicros: s.request_fee_micros, leaseMs: s.lease_ms });

/** The attempt a submission started and this process claimed: everything it needs is at hand. */
function claimedAttempt(s: Submission, submitted: Submitted): Attempt {
  return {
    id: submitted.requestId,
    attempt: 1,
    namespaceId: s.namespaceId,
    dialect: s.dialect,
    streaming: s.streaming,
    forwardedHeaders: s.forwardedHeaders,
    hops: s.hops,
    body: s.body,
    firstSeq: 1,
    sealedCredential: s.sealedCredential,
    backend: s.backend,
    jobId: submitted.jobId,
    cancelRequested: false,
  };
}

/** `pool` serves metered submissions (each its own transaction); batches have a connection of their own. */
export function createSubmitter(conn: ConnectionConfig, pool: Pool, settings: SettingsCache, runner: LocalRunner | null): Submitter {
  const lanes = WRITER_SHARD.submissions.length;
  const writer = createBatchPool(conn, 'sarsen-submissions', lanes);
  const batches = createBatcher<NewRequest, Submitted | null>(
    (batch, lane) =>
      retryTransient(() => submitBatch(writer, batch, submitSettings(settings.current()), WRITER_SHARD.submissions[lane]!), OUTAGE_PATIENCE_MS),
    { maxBatch: MAX_BATCH, lanes, spareAt: SPARE_LANE_AT },
  );
  // A repeat after a lost connection finds what the first try committed (see submitBatch).
  const once = (r: NewRequest): Promise<Submitted | null> => {
    const s = settings.current();
    return s.metering_enabled ? retryTransient(() => submitMetered(pool, r, submitSettings(s)), OUTAGE_PATIENCE_MS) : batches.add(r);
  };

  return {
    async submit(s) {
      const owner = runner?.reserve() ? runner.owner : null;
      let started = false;
      try {
        for (;;) {
          const submitted = await once({ ...s, owner });
          if (submitted === null) continue; // an identical body's claim was committed meanwhile: land on it
          if (owner !== null && !submitted.attached) {
            runner!.run(claimedAttempt(s, submitted), { background: !s.waited });
            started = true;
          }
          return submitted;
        }
      } finally {
        if (owner !== null && !started) runner!.release();
      }
    },
    close: () => writer.end(),
  };
}
