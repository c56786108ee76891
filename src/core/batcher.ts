// Group commit, as a shape: items that arrive while a flush is in flight wait for the next one,
// which takes them all (up to `maxBatch`), so a burst of N costs a few flushes instead of N;
// why it has lanes and a spare one: docs/durability.md "Group commits".

/**
 * Where the group-committing writers open a spare lane: a spare carrying this many spends
 * little of its work on being a statement of its own (docs/measurements.md "Costs measured in
 * isolation").
 */
export const SPARE_LANE_AT = 32;

/** The lanes of the submission and terminal writers: a flush, and a spare beside it. */
export const WRITER_LANES = 2;

/**
 * How long the submission and terminal writers' lanes linger (BatcherOptions.linger): on a busy
 * process each turn of the event loop brings answers and requests that other work let in, so a
 * statement carries several times as many items; on an idle one the first turn is empty and
 * costs microseconds (docs/measurements.md "Lingering"). Frames do not linger: a flush of them
 * carries a hundred already while the one before commits.
 */
export const LINGER_TURNS = 10;

const turn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

export type Batcher<T, R> = {
  add(item: T): Promise<R>;
  /** Items waiting for a flush, plus those in flight. */
  size(): number;
};

export type BatcherOptions = {
  maxBatch: number;
  /**
   * Flushes in flight at once, each on a lane of its own that the flush is told. Items carry no
   * order across lanes: a writer whose items must land in order keeps one.
   */
  lanes?: number;
  /** Items that must wait before a lane opens beside one in flight. */
  spareAt?: number;
  /**
   * Turns of the event loop a lane may wait before it flushes a batch shorter than
   * SPARE_LANE_AT, for the turns to add to it; it stops at the first turn that adds nothing.
   * None by default.
   */
  linger?: number;
};

/**
 * An idle batcher flushes on the next turn of the event loop, with what arrived by then (and,
 * lingering, what the turns after it add).
 * `flush` answers one result per item, in order; if it throws, every item of its batch fails
 * with that error.
 */
export function createBatcher<T, R>(flush: (items: T[], lane: number) => Promise<R[]>, opts: BatcherOptions): Batcher<T, R> {
  type Waiting = { item: T; resolve: (r: R) => void; reject: (err: unknown) => void };
  let queue: Waiting[] = [];
  let inFlight = 0;
  const lanes = opts.lanes ?? 1;
  const spareAt = opts.spareAt ?? 1;
  const lingerTurns = opts.linger ?? 0;
  const idle = Array.from({ length: lanes }, (_, lane) => lane);
  let scheduled = false;
  // Whether a lane (`holding` one already, or about to take one) may flush now: no other is in
  // flight, or enough waits for a spare.
  const mayFlush = (holding: boolean): boolean =>
    queue.length > 0 && (lanes - idle.length - (holding ? 1 : 0) === 0 || queue.length >= spareAt);

  const take = (): Waiting[] => {
    const batch = queue.length <= opts.maxBatch ? queue : queue.slice(0, opts.maxBatch);
    queue = batch === queue ? [] : queue.slice(batch.length);
    return batch;
  };

  // A short batch waits while each turn of the event loop adds to it.
  const linger = async (): Promise<void> => {
    for (let turns = 0; turns < lingerTurns && queue.length < SPARE_LANE_AT; turns++) {
      const before = queue.length;
      await turn();
      if (queue.length === before) return;
    }
  };

  // A lane flushes until the queue is empty (or, beside another in flight, too short for a
  // spare); what arrives meanwhile goes to another idle lane (on the next turn, with whatever
  // else that turn brought) or waits for this one.
  const run = async (lane: number): Promise<void> => {
    while (mayFlush(true)) {
      if (lingerTurns > 0) {
        await linger();
        if (queue.length === 0) break; // a spare lane took them meanwhile
      }
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
    if (scheduled || idle.length === 0 || !mayFlush(false)) return;
    scheduled = true;
    setImmediate(() => {
      scheduled = false;
      if (idle.length > 0 && mayFlush(false)) void run(idle.shift()!);
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
