// Items a producer handed to a group-committing writer and that have not settled yet (a
// stream's frames on their way to the table). The producer does not wait for each commit: it
// reads on while flushes are in flight and pauses only once the backlog passes its bound. It
// answers only after everything it handed over settled, and the first failed write is kept
// (and reported at once, so the producer can stop reading).

export type CommitBacklog<E> = {
  /** `count` more items were handed to the writer. */
  handed(count: number): void;
  /** `count` items settled; `failure` when their write failed (only the first is kept). */
  settled(count: number, failure?: E): void;
  /** More than the bound have not settled: the producer waits for `drained()` before reading on. */
  full(): boolean;
  /** Resolves once at most half the bound have not settled. */
  drained(): Promise<void>;
  /** Resolves, with the first failure or null, once everything handed over settled. */
  allSettled(): Promise<E | null>;
};

export function createCommitBacklog<E>(bound: number, onFirstFailure: (failure: E) => void): CommitBacklog<E> {
  let unsettled = 0;
  let firstFailure: E | null = null;
  const waiters = new Set<() => void>();
  const atMost = (count: number) =>
    new Promise<void>((resolve) => {
      const check = () => {
        if (unsettled > count) return;
        waiters.delete(check);
        resolve();
      };
      waiters.add(check);
      check();
    });
  return {
    handed(count) {
      unsettled += count;
    },
    settled(count, failure) {
      if (failure !== undefined && firstFailure === null) {
        firstFailure = failure;
        onFirstFailure(failure);
      }
      unsettled -= count;
      for (const wake of waiters) wake();
    },
    full: () => unsettled > bound,
    drained: () => atMost(bound / 2),
    allSettled: () => atMost(0).then(() => firstFailure),
  };
}
