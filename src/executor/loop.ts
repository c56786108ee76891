// The one start/stop of every background loop of an executor (recovery, retention, batch
// dispatch): a pass, then the pause it asks for, then the next pass, until stopped. A pass that
// throws is handed to `failed`, which logs it and says how long to pause before trying again; a
// loop never dies of a failed pass. `stop()` ends the pause at once and waits for a pass in
// flight, so nothing a loop started outlives the process's stop.

export type Loop = { stop(): Promise<void> };

/**
 * Runs `pass` after `firstDelayMs`, then again after each pause it answers (ms), until stopped.
 * `failed(err)` answers the pause after a pass that threw.
 */
export function startLoop(pass: () => Promise<number>, opts: { firstDelayMs: number; failed: (err: unknown) => number }): Loop {
  let stopped = false;
  let timer: NodeJS.Timeout | null = null;
  let running: Promise<void> | null = null;

  const schedule = (ms: number) => {
    if (!stopped) timer = setTimeout(tick, ms);
  };
  const tick = () => {
    timer = null;
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
    async stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      await running;
    },
  };
}
