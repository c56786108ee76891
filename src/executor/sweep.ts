// Recovery (docs/durability.md "Recovery"). Every executor process runs this loop, but only the
// one holding the watch lock (src/db/liveness.ts) does the work; the others try that lock once
// per check, one statement, so a process's cost does not grow with the number of processes.
// The watcher, every `liveness_check_ms`, looks with one statement for listed executors that
// died and for expired leases, and re-dispatches what they held at once. Every
// `sweep_interval_ms`, and as soon as it becomes the watcher, it also runs the full sweep: every
// running lease's owner checked (an owner that was never listed), jobs stranded by a pool nobody
// listed, and the buses of dead processes forgotten. At every check it also folds the counter
// deltas the write paths appended into the counters (src/db/counters.ts), and with the full sweep
// frees their space.
import type { BaseDeps } from '../deps.ts';
import { recoverDeadAttempts, redispatchStranded, type Recovered } from '../db/recovery.ts';
import { recoverExecutors, watchExecutors, type Liveness } from '../db/liveness.ts';
import { reconcileBuses } from '../db/events.ts';
import { foldCounters, vacuumDeltas } from '../db/counters.ts';
import { connectionFailed } from '../db/pool.ts';
import { logger } from '../log.ts';
import { countRecoveries, countSweep } from '../metrics/metrics.ts';
import { startLoop, type Loop } from './loop.ts';

const BATCH = 100;

export function startSweeper(deps: BaseDeps, liveness: Liveness): Loop {
  const owner = liveness.owner;
  let stopped = false;
  // When this process last ran the full sweep as the watcher; null while it does not watch.
  let lastFullSweep: number | null = null;

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
    await vacuumDeltas(deps.pool);
  };

  const check = async () => {
    if (!(await liveness.watching())) {
      lastFullSweep = null;
      return;
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
    if (lastFullSweep === null || now - lastFullSweep >= deps.settings.current().sweep_interval_ms) {
      lastFullSweep = now;
      await fullSweep().then(
        () => countSweep('recovery', true),
        (err: unknown) => {
          countSweep('recovery', false);
          throw err;
        },
      );
    } else if (expired) await recoverExpired();
    await foldCounters(deps.pool);
  };

  const pause = () => deps.settings.current().liveness_check_ms;
  const loop = startLoop(() => check().then(pause), {
    firstDelayMs: 0,
    failed: (err) => {
      connectionFailed('recovery check failed; will try again', err);
      return pause();
    },
  });
  return {
    stop() {
      stopped = true; // a recovery under way stops between its batches
      return loop.stop();
    },
  };
}
