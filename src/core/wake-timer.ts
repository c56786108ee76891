// The one timer of a waiter that is woken often (a watch of a live stream is woken by every
// frame). It is armed for the earliest wake-up asked for and never re-armed for a later one:
// a timer per wait would cost more than the frame it waits for. It also keeps a backstop: when
// it fires and no news came for `backstopMs`, it says so, and the waiter re-reads its source.

/** Time and timers, injected so a test can drive them. */
export type Clock = Readonly<{
  now(): number;
  setTimeout(fire: () => void, ms: number): unknown;
  clearTimeout(timer: unknown): void;
}>;

export const systemClock: Clock = {
  now: Date.now,
  setTimeout: (fire, ms) => setTimeout(fire, ms),
  clearTimeout: (timer) => clearTimeout(timer as NodeJS.Timeout),
};

export type WakeTimer = {
  /** News arrived: the backstop interval starts again. */
  heard(): void;
  /** Wake within `ms` (at most the backstop interval), unless already armed to wake sooner. */
  wakeWithin(ms: number): void;
  /** Disarms it for good. */
  stop(): void;
};

/** `onWake(backstopDue)`: the timer fired; `backstopDue` when nothing was heard for `backstopMs`. */
export function createWakeTimer(backstopMs: number, onWake: (backstopDue: boolean) => void, clock: Clock = systemClock): WakeTimer {
  let lastHeard = clock.now();
  let timer: unknown;
  let armedFor = Infinity;
  const fire = () => {
    timer = undefined;
    armedFor = Infinity;
    onWake(clock.now() - lastHeard >= backstopMs);
  };
  return {
    heard() {
      lastHeard = clock.now();
    },
    wakeWithin(ms) {
      const now = clock.now();
      const at = now + Math.max(0, Math.min(ms, backstopMs));
      if (at >= armedFor) return;
      if (timer !== undefined) clock.clearTimeout(timer);
      armedFor = at;
      timer = clock.setTimeout(fire, at - now);
    },
    stop() {
      if (timer !== undefined) clock.clearTimeout(timer);
      timer = undefined;
      armedFor = Infinity;
    },
  };
}
