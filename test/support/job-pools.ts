// graphile-worker emits 'pool:listen:success' as it sends a pool's LISTEN for new jobs, before
// the LISTEN has run: a job added in between is heard of only at the next poll. A query sent
// behind the LISTEN, on the same connection, answers once it has taken effect.
import type { WorkerEvents } from 'graphile-worker';

/** Calls `listening` with a pool's id once its LISTEN, on `events`, is in effect. */
export function onListening(events: WorkerEvents, listening: (poolId: string) => void): void {
  events.on('pool:listen:success', ({ workerPool, client }) => void client.query('SELECT 1').then(() => listening(workerPool.id), () => undefined));
}
