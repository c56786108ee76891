// When a process that went idle should collect its garbage (docs/durability.md "Bounded
// memory"). V8 collects when it allocates, so a process that goes quiet after a burst (readers
// that left, a load that passed) keeps the burst's garbage, its grown young generation and its
// freed pages for as long as it stays quiet. One full collection of the kind V8 makes under
// memory pressure, once it is idle, gives that back to the system.
//
// The process is measured against the lowest resident size it had (what it needs at rest).
// While it stays above that by `growthBytes` and idle, it collects again after a delay that
// doubles each time, so that what stays (live memory) is collected for rarely. A busy sample,
// growth by `growthBytes` over the lowest size since the last collection, or fewer connections
// open than at the last collection starts the delays over: what callers held while connected
// became garbage when they left, and waiting out a long delay would keep it.

export type IdleCollectionOptions = Readonly<{
  /** Resident growth above the resting size that is worth a collection. */
  growthBytes: number;
  /** Event-loop utilisation over a sample at or under which the process is idle. */
  idleUtilization: number;
  /** Utilisation over which a sample counts as work: the delays start over. */
  busyUtilization: number;
  /** The first delay between two collections, and the longest. */
  firstDelayMs: number;
  maxDelayMs: number;
}>;

export type IdleCollection = {
  /**
   * A sample of the process: `rss` in bytes, the loop's utilisation since the last sample, the
   * HTTP connections open now. True: collect now.
   */
  sample(now: number, rss: number, utilization: number, connections: number): boolean;
};

export function createIdleCollection(opts: IdleCollectionOptions): IdleCollection {
  let resting = Infinity;
  let sinceLast = Infinity; // the lowest size since the last collection
  let last = -Infinity; // when it last collected
  let collections = 0; // since the delays started over
  let connected = 0; // the fewest connections open since the last collection
  return {
    sample(now, rss, utilization, connections) {
      resting = Math.min(resting, rss);
      sinceLast = Math.min(sinceLast, rss);
      const left = connections < connected;
      connected = Math.min(connected, connections);
      if (rss - resting < opts.growthBytes) {
        collections = 0;
        return false;
      }
      if (utilization > opts.busyUtilization || rss - sinceLast >= opts.growthBytes || left) collections = 0;
      if (utilization > opts.idleUtilization) return false;
      if (now < last + Math.min(opts.firstDelayMs * 2 ** Math.max(collections - 1, 0), opts.maxDelayMs)) return false;
      collections++;
      last = now;
      sinceLast = rss;
      connected = connections;
      return true;
    },
  };
}
