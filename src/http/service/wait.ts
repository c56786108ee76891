// Waiting on a request without polling the database in a loop: subscribe to its bus key,
// re-read on every event and after every bus reconnect (NOTIFY is not replayed), with a slow
// poll as the backstop.
import type { Deps } from '../../deps.ts';
import { readStatus, type RequestStatus } from '../../db/requests.ts';

const BACKSTOP_POLL_MS = 2_000;

export const isTerminal = (s: RequestStatus | null): boolean => s === 'succeeded' || s === 'failed';

/**
 * Resolves with the terminal status once the request settles, or null when `timeoutMs` passes
 * or `signal` aborts first (a waiter leaving never touches the execution).
 */
export async function waitForTerminal(
  deps: Deps,
  requestId: string,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<RequestStatus | null> {
  const deadline = Date.now() + timeoutMs;
  let generation = 0;
  let wake: (() => void) | null = null;
  const poke = () => {
    generation++;
    wake?.();
  };
  const unsubscribe = deps.bus.subscribe(`req:${requestId}`, poke);
  const unReconnect = deps.bus.onReconnect(poke);
  signal?.addEventListener('abort', poke);
  try {
    for (;;) {
      const seen = generation;
      const status = await readStatus(deps.pool, requestId);
      if (isTerminal(status)) return status;
      const remaining = deadline - Date.now();
      if (remaining <= 0 || signal?.aborted) return null;
      if (generation !== seen) continue; // an event arrived while we were reading
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, Math.min(remaining, BACKSTOP_POLL_MS));
        function done() {
          clearTimeout(timer);
          wake = null;
          resolve();
        }
        wake = done;
      });
    }
  } finally {
    unsubscribe();
    unReconnect();
    signal?.removeEventListener('abort', poke);
  }
}
