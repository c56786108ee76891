// The attempts a process runs, whichever way they came: claimed in the acceptance commit by
// this process (role both, docs/durability.md "Run where accepted": no job pickup between
// acceptance and the provider call), or claimed from a graphile-worker job. It bounds how many
// run at once (its slots), lets work nobody waits on yield to acceptance (./yield.ts), renews
// all their leases in one statement per heartbeat (a lease found taken aborts that attempt's
// provider call), writes each outcome, and at shutdown hands back what cannot finish in time.
import { setTimeout as sleep } from 'node:timers/promises';
import { createBatchPool, connectionFailed, isConnectionLoss, retryTransient } from '../db/pool.ts';
import { claimAttempts, renewLeases, type Attempt } from '../db/attempts.ts';
import { createBatcher } from '../core/batcher.ts';
import { runAttempt, LeaseLost, HandBack, StoreFailed, Cancelled, type ExecutorDeps, type Outcome } from './execute.ts';
import { createSettle } from './settle.ts';
import { createYielder } from './yield.ts';
import { logger, errorFields } from '../log.ts';
import type { RunWhereAccepted } from '../deps.ts';
import type { Activity } from './activity.ts';
import { tracer } from '../telemetry/tracing.ts';
import { traceAttempt, attemptEnded, attemptYielded } from '../telemetry/spans.ts';

// Jobs a worker pool hands out together are claimed together.
const MAX_CLAIMS = 256;
// After the grace, how long hand-backs may take to be written before the process goes anyway.
const HAND_BACK_WAIT_MS = 10_000;

/**
 * `reserve` and `start`: the hand-off from acceptance in this process (see RunWhereAccepted);
 * the slot is taken before the commit, and freed when it claimed nothing.
 */
export type AttemptRunner = RunWhereAccepted & {
  /** graphile-worker's task: claims the job's request (batched with its neighbours') and runs it; `callerWaits`: somebody may be waiting on it. */
  runJob(requestId: string, opts?: { callerWaits?: boolean }): Promise<void>;
  /** Lets attempts finish within the grace, then hands back the rest and waits for that to be written. */
  stop(graceMs: number): Promise<void>;
};

type Running = { attempt: Attempt; controller: AbortController; renewedAt: number };

/** Why runAttempt threw, as an outcome; anything else is a fault in Sarsen and is rethrown. */
function interrupted(err: unknown, signal: AbortSignal): Outcome {
  const reason: unknown = signal.aborted ? signal.reason : err;
  if (reason instanceof HandBack) return { kind: 'handed_back', reason: 'shutdown' };
  if (reason instanceof LeaseLost || err instanceof LeaseLost) return { kind: 'lease_lost' };
  if (err instanceof StoreFailed || isConnectionLoss(err)) {
    const cause = err instanceof StoreFailed ? err.cause : err;
    return { kind: 'handed_back', reason: 'database connection lost', cause: cause instanceof Error ? cause.message : String(cause) };
  }
  throw err;
}

/**
 * `owner`: the lease owner this process's attempts carry (its liveness lock is named by it).
 * `activity` (the executor's): told of each attempt, so that the deployment hears that work runs.
 */
export function createAttemptRunner(deps: ExecutorDeps, opts: { owner: string; concurrency: number; activity?: Pick<Activity, 'began'> }): AttemptRunner {
  const { owner, concurrency } = opts;
  const { settle, close: closeSettle } = createSettle(deps);
  // Claims and lease renewals: batch statements on a connection of their own.
  const writer = createBatchPool(deps.conn, 'sarsen-claims');
  const yielder = createYielder();
  const active = new Set<Running>();
  // Slots held by submissions whose acceptance commit may claim for this process.
  let reserved = 0;
  let stopping = false;

  const claims = createBatcher<string, Attempt | null>(
    async (ids) => {
      const claimed = await retryTransient(() => claimAttempts(writer, ids, owner, deps.settings.current().lease_ms));
      // Two jobs naming one request (a re-dispatch beside a stranded job): only one runs it.
      return ids.map((id) => {
        const attempt = claimed.get(id) ?? null;
        claimed.delete(id);
        return attempt;
      });
    },
    { maxBatch: MAX_CLAIMS },
  );

  // Traced, an attempt is a span: the request's trace continued, or after a recovery a trace linked to it.
  const execute = (attempt: Attempt, callerWaits: boolean): Promise<void> =>
    tracer === null ? executeOne(attempt, callerWaits) : traceAttempt(tracer, attempt, () => executeOne(attempt, callerWaits));

  const executeOne = async (attempt: Attempt, callerWaits: boolean): Promise<void> => {
    const running: Running = { attempt, controller: new AbortController(), renewedAt: Date.now() };
    active.add(running);
    const ended = opts.activity?.began() ?? (() => {});
    // A cancel heard on the bus stops the call at once; one whose event was lost, at the next renewal.
    const unsubscribe = deps.bus.onRequest(attempt.id, (ev) => {
      if (ev.type === 'cancel') running.controller.abort(new Cancelled('the request was cancelled'));
    });
    try {
      let outcome: Outcome;
      try {
        // Leased meanwhile (the heartbeat renews it); an abort lets it go on to runAttempt, which answers for it.
        if (!callerWaits) {
          await yielder.wait(running.controller.signal);
          if (tracer !== null) attemptYielded();
        }
        outcome = await runAttempt(deps, attempt, deps.settings.current(), running.controller.signal);
      } catch (err) {
        outcome = interrupted(err, running.controller.signal);
        running.controller.abort(); // stop the provider call: a zombie must not keep spending tokens
      }
      if (tracer !== null) attemptEnded(outcome.kind);
      await settle(attempt, outcome);
    } catch (err) {
      // Left running under its lease: the recovery sweep re-dispatches it once the lease expires.
      if (isConnectionLoss(err)) connectionFailed('an attempt\'s outcome could not be written', err);
      else logger.error('attempt failed unexpectedly', { request_id: attempt.id, attempt: attempt.attempt, ...errorFields(err) });
    } finally {
      unsubscribe();
      active.delete(running);
      ended();
    }
  };

  // Each lease is renewed heartbeat_ms after it was taken or last renewed; one statement
  // renews all that are due (the ticker runs at half the interval, so a renewal comes at most
  // 1.5 heartbeats after the last). A lease whose fence closed aborts that attempt.
  let ticker: NodeJS.Timeout | null = null;
  const renew = async (): Promise<void> => {
    const { heartbeat_ms: heartbeatMs, lease_ms: leaseMs } = deps.settings.current();
    const now = Date.now();
    const due = [...active].filter((running) => now - running.renewedAt >= heartbeatMs);
    if (due.length === 0) return;
    try {
      const still = await renewLeases(writer, due.map(({ attempt }) => ({ id: attempt.id, attempt: attempt.attempt })), leaseMs);
      for (const running of due) {
        const held = still.get(running.attempt.id);
        if (!held) {
          running.controller.abort(new LeaseLost('the lease was lost'));
          continue;
        }
        running.renewedAt = now;
        if (held.cancelRequested) running.controller.abort(new Cancelled('the request was cancelled'));
      }
    } catch (err) {
      connectionFailed('lease renewal failed', err);
    }
  };
  const tick = () => {
    ticker = setTimeout(() => void renew().finally(() => ticker && tick()), deps.settings.current().heartbeat_ms / 2);
  };
  tick();

  return {
    reserve() {
      yielder.arrival();
      if (stopping || active.size + reserved >= concurrency) return null;
      // The slot is this submission's until its commit settles: what it claimed runs in it.
      reserved++;
      return owner;
    },
    start(claimed, { callerWaits }) {
      reserved--;
      if (claimed) void execute(claimed, callerWaits);
    },
    async runJob(requestId, opts) {
      const attempt = await claims.add(requestId);
      if (attempt) await execute(attempt, opts?.callerWaits ?? false);
    },
    async stop(graceMs) {
      stopping = true;
      yielder.releaseAll();
      const deadline = Date.now() + graceMs;
      while (active.size > 0 && Date.now() < deadline) await sleep(25);
      for (const running of active) running.controller.abort(new HandBack('the process is stopping'));
      const handBackDeadline = Date.now() + HAND_BACK_WAIT_MS;
      while (active.size > 0 && Date.now() < handBackDeadline) await sleep(10);
      if (ticker) clearTimeout(ticker);
      ticker = null;
      await Promise.all([closeSettle(), writer.end()]);
    },
  };
}
