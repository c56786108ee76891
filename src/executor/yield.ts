// Background work yields to acceptance. A process that both accepts and executes shares its
// event loop (and, on a small machine, the cores) between taking submissions and running them.
// Work nobody waits on (POST /requests, and jobs) starts at once unless the process is
// accepting submissions and its loop is saturated; then it waits until the burst passes, so a
// burst is accepted at the rate acceptance alone can reach and its backlog drains right after
// (docs/durability.md "Acceptance first"): `arrivalWindowMs` after the last arrival, everything
// waiting starts.
// The wait is bounded: under sustained overload, work still starts `maxWaitMs` after it was
// ready. Waiting work is already claimed, under a lease the runner keeps renewing, and has not
// reached the provider. Nothing waits in memory beyond the runner's slots; the rest of a
// backlog waits as due jobs in the database.
import { performance } from 'node:perf_hooks';

export type YieldSettings = Readonly<{
  /** Event-loop utilisation from which the loop counts as saturated. */
  busyUtilisation: number;
  /** How long after the last submission arrived the process still counts as accepting. */
  arrivalWindowMs: number;
  /** The longest a background start waits, whatever the load. */
  maxWaitMs: number;
  /** The window the loop's utilisation is measured over. */
  sampleMs: number;
  /** How often waiting work is looked at. */
  tickMs: number;
  /** While submissions arrive and the loop has headroom, how many waiting starts a tick lets go. */
  perTick: number;
}>;

// The threshold sits below what acceptance alone keeps busy, so a burst holds background work
// back (docs/performance.md "What bounds the figures"). A loop that waits on a commit dips
// below it for a moment: sampled over a window and let go a few at a time while submissions
// still arrive, such a dip does not start the whole backlog at once.
export const YIELD_SETTINGS: YieldSettings = { busyUtilisation: 0.5, arrivalWindowMs: 100, maxWaitMs: 10_000, sampleMs: 100, tickMs: 20, perTick: 16 };

/** Whether background work waits now: only while submissions arrive and the loop is saturated. */
export function mustYield(s: YieldSettings, load: { utilisation: number; sinceArrivalMs: number }): boolean {
  return load.sinceArrivalMs < s.arrivalWindowMs && load.utilisation >= s.busyUtilisation;
}

export type Yielder = {
  /** A submission arrived (the process is accepting). */
  arrival(): void;
  /** Resolves when background work may start; at once when `signal` aborts. */
  wait(signal: AbortSignal): Promise<void>;
  /** Lets everything waiting start (the process is stopping). */
  releaseAll(): void;
};

/** The event loop's utilisation over the last window of at least `windowMs`. */
export function loopUtilisation(windowMs: number): () => number {
  let mark = { at: performance.now(), elu: performance.eventLoopUtilization() };
  let utilisation = 0;
  return () => {
    const now = performance.now();
    if (now - mark.at >= windowMs) {
      const elu = performance.eventLoopUtilization();
      utilisation = performance.eventLoopUtilization(elu, mark.elu).utilization;
      mark = { at: now, elu };
    }
    return utilisation;
  };
}

export function createYielder(s: YieldSettings = YIELD_SETTINGS, utilisation: () => number = loopUtilisation(s.sampleMs)): Yielder {
  type Waiting = { since: number; go: () => void };
  let waiting: Waiting[] = [];
  let lastArrival = -Infinity;
  let timer: NodeJS.Timeout | null = null;
  const yieldNow = (now: number) => mustYield(s, { utilisation: utilisation(), sinceArrivalMs: now - lastArrival });

  const tick = () => {
    const now = performance.now();
    const accepting = now - lastArrival < s.arrivalWindowMs;
    // Nothing arriving: all of it. Arriving, with headroom: a few. Saturated: none. And
    // whatever has waited its longest, in any case.
    let free = !accepting ? Infinity : yieldNow(now) ? 0 : s.perTick;
    const stillWaiting: Waiting[] = [];
    for (const w of waiting) {
      if (free > 0 || now - w.since >= s.maxWaitMs) {
        free--;
        w.go();
      } else stillWaiting.push(w);
    }
    waiting = stillWaiting;
    timer = waiting.length > 0 ? setTimeout(tick, s.tickMs) : null;
  };

  return {
    arrival() {
      lastArrival = performance.now();
    },
    wait(signal) {
      const now = performance.now();
      if (signal.aborted || (waiting.length === 0 && !yieldNow(now))) return Promise.resolve();
      return new Promise<void>((resolve) => {
        const w: Waiting = {
          since: now,
          go: () => {
            signal.removeEventListener('abort', w.go);
            resolve();
          },
        };
        signal.addEventListener('abort', w.go, { once: true });
        waiting.push(w);
        timer ??= setTimeout(tick, s.tickMs);
      });
    },
    releaseAll() {
      const all = waiting;
      waiting = [];
      if (timer) clearTimeout(timer);
      timer = null;
      for (const w of all) w.go();
    },
  };
}
