// Group commit, as a shape: items that arrive while a flush is in flight wait for the next one,
// which takes them all (up to `maxBatch`), so a burst of N costs a few flushes instead of N.
// An idle batcher flushes at once, taking what arrived in the same turn of the event loop. The
// flush function answers one result per item, in order; if it throws, every item of its
// batch fails with that error.

export type Batcher<T, R> = {
  add(item: T): Promise<R>;
  /** Items waiting for a flush, plus those in flight. */
  size(): number;
};

export function createBatcher<T, R>(flush: (items: T[]) => Promise<R[]>, opts: { maxBatch: number }): Batcher<T, R> {
  type Waiting = { item: T; resolve: (r: R) => void; reject: (err: unknown) => void };
  let queue: Waiting[] = [];
  let inFlight = 0;
  let flushing = false;

  const run = async (): Promise<void> => {
    while (queue.length > 0) {
      const batch = queue.length <= opts.maxBatch ? queue : queue.slice(0, opts.maxBatch);
      queue = batch === queue ? [] : queue.slice(batch.length);
      inFlight = batch.length;
      try {
        const results = await flush(batch.map((w) => w.item));
        for (let i = 0; i < batch.length; i++) batch[i]!.resolve(results[i]!);
      } catch (err) {
        for (const w of batch) w.reject(err);
      }
      inFlight = 0;
    }
    flushing = false;
  };

  return {
    add(item) {
      return new Promise<R>((resolve, reject) => {
        queue.push({ item, resolve, reject });
        if (!flushing) {
          flushing = true;
          setImmediate(() => void run());
        }
      });
    },
    size: () => queue.length + inFlight,
  };
}
