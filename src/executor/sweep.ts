// Recovery (docs/durability.md "Recovery"). Every executor process runs this loop, but only the
// one holding the watch lock (src/db/liveness.ts) does the work: one sweeper does each sweep.
// The watcher looks with one statement for listed executors that died and for expired leases,
// and re-dispatches what they held at once; it also runs the full sweep (every running lease's
// owner checked (an owner that was never listed), jobs stranded by a pool nobody listed, and the
// buses of dead processes forgotten), folds the counter deltas the write paths appended into the
// counters (src/db/counters.ts), and with the full sweep frees their space.
//
// How often depends on whether work runs (src/executor/activity.ts; docs/scaling.md "An idle
// process"). While it does, the watcher looks every `liveness_check_ms` and folds at each look,
// sweeps every `sweep_interval_ms`, and each other executor tries the watch lock every second,
// so that one of them takes over within a second of the watcher's death. While the deployment
// is idle there is nothing to recover quickly: the watcher looks every IDLE_LOOK_MS, folds every
// IDLE_FOLD_MS and sweeps every IDLE_SWEEP_MS, and the others try the lock every IDLE_TRY_MS;
// news of work wakes them all at once, so the first attempt after a quiet spell is watched as
// closely as any.
import type { BaseDeps } from '../deps.ts';
import { recoverDeadAttempts, redispatchStranded, type Recovered } from '../db/recovery.ts';
import { recoverExecutors, watchExecutors, type Liveness } from '../db/liveness.ts';
import { reconcileBuses } from '../db/events.ts';
import { foldCounters, vacuumDeltas } from '../db/counters.ts';
import { connectionFailed } from '../db/pool.ts';
import { logger } from '../log.ts';
import { countRecoveries, countSweep } from '../metrics/metrics.ts';
import { startLoop, type Loop } from './loop.ts';
import type { Activity } from './activity.ts';

const BATCH = 100;
/** The idle watcher's look, fold and full sweep (or the settings' paces, when slower). */
export const IDLE_LOOK_MS = 5_000;
export const IDLE_FOLD_MS = 60_000;
export const IDLE_SWEEP_MS = 300_000;
/** How often an executor that does not watch tries the watch lock: while work runs, and while idle. */
export const BUSY_TRY_MS = 1_000;
export const IDLE_TRY_MS = 30_000;

export function startSweeper(deps: BaseDeps, liveness: Liveness, activity: Activity): Loop {
  const owner = liveness.owner;
  let stopped = false;
  // When this process last ran the full sweep as the watcher; null while it does not watch.
  let lastFullSweep: number | null = null;
  // When the watcher last folded the counters, and whether it folded any since it last freed
  // their space (a new watcher does not know what the last one left).
  let lastFold = -Infinity;
  let unvacuumed = true;

  const announce = (recovered: readonly Recovered[], how: string) => {
    countRecoveries(recovered.length);
    for (const r of recovered) {
      deps.bus.publishRequest({ type: 'superseded', requestId: r.id });
      logger.warn(how, { request_id: r.id, attempt: r.attempt });
    }
  };

  const recoverExpired = async () => {
    for (;;) {
      const recovered = await recoverDeadAttempts(deps.pool, owner, BATCH, liveness.settling());
      announce(recovered, 'recovered a request from a dead attempt');
      if (recovered.length < BATCH || stopped) return;
    }
  };

  const fullSweep = async () => {
    await reconcileBuses(deps.pool);
    const stranded = await redispatchStranded(deps.pool, deps.settings.current().lease_ms);
    for (const id of stranded) logger.warn('re-dispatched a request whose job a dead worker held', { request_id: id });
    await recoverExpired();
    if (!unvacuumed) return;
    await vacuumDeltas(deps.pool);
    unvacuumed = false;
  };

  /** One check; answers the pause before the next. */
  const check = async (): Promise<number> => {
    const s = deps.settings.current();
    const busy = activity.busy();
    if (!(await liveness.watching())) {
      lastFullSweep = null;
      return busy ? Math.max(BUSY_TRY_MS, s.liveness_check_ms) : IDLE_TRY_MS;
    }
    const { dead, expired } = await watchExecutors(deps.pool, owner, liveness.settling());
    if (dead.length > 0) {
      const found = await recoverExecutors(deps.pool, owner, dead);
      announce(found.recovered, 'recovered a request whose executor died');
      if (found.dead.length > 0) {
        logger.warn('executors died', { executors: found.dead, recovered: found.recovered.length, jobs_freed: found.jobs.freed, jobs_deleted: found.jobs.deleted });
        // Statements stop notifying the dead processes' buses.
        await reconcileBuses(deps.pool);
      }
    }
    const now = performance.now();
    const sweepEvery = busy ? s.sweep_interval_ms : Math.max(s.sweep_interval_ms, IDLE_SWEEP_MS);
    if (lastFullSweep === null || now - lastFullSweep >= sweepEvery) {
      lastFullSweep = now;
      await fullSweep().then(
        () => countSweep('recovery', true),
        (err: unknown) => {
          countSweep('recovery', false);
          throw err;
        },
      );
    } else if (expired) await recoverExpired();
    if (busy || now - lastFold >= Math.max(s.liveness_check_ms, IDLE_FOLD_MS)) {
      lastFold = now;
      if ((await foldCounters(deps.pool)) > 0) unvacuumed = true;
    }
    return busy ? s.liveness_check_ms : Math.max(s.liveness_check_ms, IDLE_LOOK_MS);
  };

  const loop = startLoop(check, {
    firstDelayMs: 0,
    failed: (err) => {
      connectionFailed('recovery check failed; will try again', err);
      return deps.settings.current().liveness_check_ms;
    },
  });
  // News of work after a quiet spell: look (or try the watch lock) now.
  const unBusy = activity.onBusy(() => loop.wake());
  return {
    wake: () => loop.wake(),
    stop() {
      stopped = true; // a recovery under way stops between its batches
      unBusy();
      return loop.stop();
    },
  };
}
