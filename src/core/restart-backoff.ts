// When a cluster's primary replaces a worker that died: soon the first time, then twice as
// late for every replacement that died young as well, so a crash loop does not spin; a worker
// that lived long enough resets the count.
export type RestartPolicy = Readonly<{ firstMs: number; maxMs: number; stableMs: number }>;

export const RESTART_POLICY: RestartPolicy = Object.freeze({ firstMs: 100, maxMs: 30_000, stableMs: 30_000 });

/** After a worker that lived `livedMs` died, with `failures` young deaths before it: the delay before its replacement, and the count to keep. */
export function restartAfter(failures: number, livedMs: number, policy: RestartPolicy = RESTART_POLICY): { delayMs: number; failures: number } {
  const previous = livedMs >= policy.stableMs ? 0 : failures;
  return { delayMs: Math.min(policy.maxMs, policy.firstMs * 2 ** Math.min(previous, 30)), failures: previous + 1 };
}
