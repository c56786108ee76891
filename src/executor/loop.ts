// The one start/stop of every background loop of an executor (recovery, retention, batch
// dispatch): a pass, then the pause it asks for, then the next pass, until stopped. A pass that
// throws is handed to `failed`, which logs it and says how long to pause before trying again; a
// loop never dies of a failed pass. `wake()` ends the pause at once (an event said there is work),
// or, during a pass, makes the next one follow without a pause: a loop woken by events needs only
// a slow pause as a backstop. `stop()` ends the pause at once and waits for a pass in flight, so
// nothing a loop started outlives the process's stop.

export type Loop = { stop(): Promise<void>; wake(): void };

/**
 * Runs `pass` after `firstDelayMs`, then again after each pause it answers (ms), until stopped.
 * `failed(err)` answers the pause after a pass that threw.
 */
export function startLoop(pass: () => Promise<number>, opts: { firstDelayMs: number; failed: (err: unknown) => number }): Loop {
  let stopped = false;
  let timer: NodeJS.Timeout | null = null;
  let running: Promise<void> | null = null;
  // Woken during a pass: the pass may have looked before the event's news committed.
  let woken = false;

  const schedule = (ms: number) => {
    if (!stopped) timer = setTimeout(tick, woken ? 0 : ms);
  };
  const tick = () => {
    timer = null;
    woken = false;
    if (stopped) return;
    let pause = 0;
    running = pass()
      .then((ms) => void (pause = ms), (err: unknown) => void (pause = opts.failed(err)))
      .finally(() => {
        running = null;
        schedule(pause);
      });
  };
  schedule(opts.firstDelayMs);

  return {
    wake() {
      if (stopped) return;
      if (timer) {
        clearTimeout(timer);
        timer = setTimeout(tick, 0);
      } else woken = true;
    },
    async stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      await running;
    },
  };
}
