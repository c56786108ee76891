// The recovery sweep: every executor process, every `sweep_interval_ms` (not cron: cron has
// minute granularity), re-dispatches requests whose worker died or whose lease expired, and
// forgets the buses of processes that died without leaving.
import type { BaseDeps } from '../deps.ts';
import { recoverDeadAttempts, redispatchStranded } from '../db/recovery.ts';
import { reconcileBuses } from '../db/events.ts';
import { connectionFailed } from '../db/pool.ts';
import { logger } from '../log.ts';
import { countRecoveries, countSweep } from '../metrics/metrics.ts';

const BATCH = 100;

export type Sweeper = { runOnce(): Promise<number>; stop(): Promise<void> };

export function startSweeper(deps: BaseDeps, owner: string): Sweeper {
  let stopped = false;
  let timer: NodeJS.Timeout | null = null;
  let running: Promise<number> | null = null;

  const runOnce = async (): Promise<number> => {
    await reconcileBuses(deps.pool);
    const stranded = await redispatchStranded(deps.pool, deps.settings.current().lease_ms);
    for (const id of stranded) logger.warn('re-dispatched a request whose job a dead worker held', { request_id: id });
    let total = 0;
    for (;;) {
      const recovered = await recoverDeadAttempts(deps.pool, owner, BATCH);
      total += recovered.length;
      countRecoveries(recovered.length);
      for (const r of recovered) {
        deps.bus.publishRequest({ type: 'superseded', requestId: r.id });
        logger.warn('recovered a request from a dead attempt', { request_id: r.id, attempt: r.attempt });
      }
      if (recovered.length < BATCH || stopped) return total;
    }
  };

  const tick = () => {
    timer = null;
    if (stopped) return;
    running = runOnce()
      .then((n) => (countSweep('recovery', true), n))
      .catch((err) => {
        countSweep('recovery', false);
        connectionFailed('recovery sweep failed; will try again', err);
        return 0;
      })
      .finally(() => {
        running = null;
        if (!stopped) timer = setTimeout(tick, deps.settings.current().sweep_interval_ms);
      });
  };
  timer = setTimeout(tick, 0);

  return {
    runOnce,
    async stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      await running;
    },
  };
}
