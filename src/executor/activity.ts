// Whether work runs anywhere in the deployment, as far as this process has heard
// (docs/scaling.md "An idle process"). The executor's loops look often only while it does:
// a process that dies with attempts in hand must be found within a second, but an idle
// deployment has nothing to find, and looking four times a second in every process cost its
// database twenty transactions a second each.
//
// News is an attempt this process runs, a `{"k":"work"}` NOTIFY from a process that runs one,
// or this process's bus connecting again (an outage may have left work to recover). A process
// running attempts announces them when it begins one after a quiet spell, and then every few
// seconds while they run, unless it heard news meanwhile: so a deployment at work sends about
// one announcement every few seconds, however many processes run attempts.
import type { Bus } from '../bus/bus.ts';
import type { Pool } from '../db/pool.ts';
import { connectionFailed } from '../db/pool.ts';
import { announceWork } from '../db/events.ts';

/** How long without news before a process running attempts announces them (again). */
export const ANNOUNCE_MS = 3_000;
/** How long after the last news a process counts the deployment as busy (over three announcements). */
export const BUSY_FOR_MS = 10_000;

export type Activity = {
  /** Whether this process runs attempts, or heard of work within BUSY_FOR_MS. */
  busy(): boolean;
  /** An attempt begins in this process; the function returned says it ended. */
  began(): () => void;
  /** Calls `fn` when news arrives while the process counted the deployment idle. */
  onBusy(fn: () => void): () => void;
  close(): void;
};

export function createActivity(pool: Pool, bus: Bus): Activity {
  let lastNews = -Infinity;
  let running = 0;
  let ticker: NodeJS.Timeout | null = null;
  const listeners = new Set<() => void>();

  const busy = () => running > 0 || performance.now() - lastNews < BUSY_FOR_MS;
  /** Runs `change`, then wakes the listeners if it turned an idle process busy. */
  const noting = (change: () => void) => {
    const wasIdle = !busy();
    change();
    if (wasIdle) for (const fn of listeners) fn();
  };
  const news = () => noting(() => void (lastNews = performance.now()));
  const announceIfQuiet = () => {
    if (performance.now() - lastNews < ANNOUNCE_MS) return;
    news();
    void announceWork(pool).catch((err: unknown) => connectionFailed('could not announce running work', err));
  };
  const unsubscribe = bus.subscribe('work', news);
  const unReconnect = bus.onReconnect(news);

  return {
    busy,
    began() {
      noting(() => void running++);
      announceIfQuiet();
      if (!ticker) {
        ticker = setInterval(announceIfQuiet, ANNOUNCE_MS / 3);
        ticker.unref();
      }
      let ended = false;
      return () => {
        if (ended) return;
        ended = true;
        running--;
        if (running > 0 || !ticker) return;
        clearInterval(ticker);
        ticker = null;
        // Busy for BUSY_FOR_MS more, as the others count it from their last news of this process.
        lastNews = performance.now();
      };
    },
    onBusy(fn) {
      listeners.add(fn);
      return () => listeners.delete(fn);
    },
    close() {
      if (ticker) clearInterval(ticker);
      ticker = null;
      unsubscribe();
      unReconnect();
      listeners.clear();
    },
  };
}
