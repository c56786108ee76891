// Group commit, as a shape: items that arrive while a flush is in flight wait for the next one,
// which takes them all (up to `maxBatch`), so a burst of N costs a few flushes instead of N.
// An idle batcher flushes at once, taking what arrived in the same turn of the event loop. The
// flush function answers one result per item, in order; if it throws, every item of its
// batch fails with that error.
//
// `lanes` lets that many flushes be in flight at once, each on a lane of its own (the flush is
// told which: its connection, its counter shard). With one lane the process and the database
// take turns: while a batch commits, the requests waiting on it leave the process idle, and
// while the process answers them and reads the next ones, the database is. A second lane
// overlaps the two. Items of one batcher carry no order across lanes; a writer whose items
// must land in order keeps one lane.

export type Batcher<T, R> = {
  add(item: T): Promise<R>;
  /** Items waiting for a flush, plus those in flight. */
  size(): number;
};

export type BatcherOptions = { maxBatch: number; lanes?: number };

export function createBatcher<T, R>(flush: (items: T[], lane: number) => Promise<R[]>, opts: BatcherOptions): Batcher<T, R> {
  type Waiting = { item: T; resolve: (r: R) => void; reject: (err: unknown) => void };
  let queue: Waiting[] = [];
  let inFlight = 0;
  const idle = Array.from({ length: opts.lanes ?? 1 }, (_, lane) => lane);
  let scheduled = false;

  const take = (): Waiting[] => {
    const batch = queue.length <= opts.maxBatch ? queue : queue.slice(0, opts.maxBatch);
    queue = batch === queue ? [] : queue.slice(batch.length);
    return batch;
  };

  // A lane flushes until the queue is empty; what arrives meanwhile goes to another idle lane
  // (on the next turn, with whatever else that turn brought) or waits for this one.
  const run = async (lane: number): Promise<void> => {
    while (queue.length > 0) {
      const batch = take();
      inFlight += batch.length;
      schedule();
      try {
        const results = await flush(batch.map((w) => w.item), lane);
        for (let i = 0; i < batch.length; i++) batch[i]!.resolve(results[i]!);
      } catch (err) {
        for (const w of batch) w.reject(err);
      }
      inFlight -= batch.length;
    }
    idle.push(lane);
  };

  const schedule = (): void => {
    if (scheduled || idle.length === 0) return;
    scheduled = true;
    setImmediate(() => {
      scheduled = false;
      if (queue.length > 0 && idle.length > 0) void run(idle.shift()!);
    });
  };

  return {
    add(item) {
      return new Promise<R>((resolve, reject) => {
        queue.push({ item, resolve, reject });
        schedule();
      });
    },
    size: () => queue.length + inFlight,
  };
}
