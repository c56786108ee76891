// Client-side deadlines on every round trip to PostgreSQL (docs/operations.md "When the network
// goes silent"). A connection whose peer has gone silent (a NAT or load balancer that forgot the
// flow, a managed database's failover that left the old connections open, a middlebox that
// acknowledges bytes it never delivers) fails no query by itself: the kernel gives up after many
// minutes, or never. So each statement a client sends is timed here, and a client that misses its
// deadline is destroyed at once: its socket goes, every query on it fails as a connection loss
// (which every caller already rides out, and repeats where that is safe), and its pool never hands
// it out again. A warning names its purpose, and a metric counts it.
//
// A connection that misses one deadline says the path to the database may be dead: the idle
// connections of the same process (opened over the same path) are discarded with it, so that the
// next callers open fresh ones instead of each meeting a dead one in turn.
//
// A connection that only LISTENs sends nothing, so nothing would ever time out on it: such a client
// proves itself alive with a round trip of its own once per deadline (never more often than every
// LISTENER_PING_MS) when it has had none meanwhile: a silent one is found within twice its
// deadline, and an idle process costs its database one ping per LISTEN connection per deadline.
import type pg from 'pg';
import { logger } from '../log.ts';
import { countDiscardedConnection } from '../metrics/metrics.ts';

/** The default deadline of one round trip (the `database_deadline_ms` setting). */
export const DEFAULT_DEADLINE_MS = 10_000;
/** The shortest pause between a LISTENing connection's pings (its deadline, when longer, sets the pace). */
export const LISTENER_PING_MS = 5_000;

/**
 * The connections of one process (or of one pool no process owns): the deadline they keep now,
 * and those idle in a pool, discarded with any of them that misses its deadline.
 */
export type DeadlinePath = {
  deadlineMs: () => number;
  readonly idle: Set<pg.Client>;
};

export function createDeadlinePath(deadlineMs: () => number = () => DEFAULT_DEADLINE_MS): DeadlinePath {
  return { deadlineMs, idle: new Set() };
}

/** A connection lost to a missed deadline: a connection loss to every caller (SQLSTATE 08006, connection_failure). */
export class DeadlineMissed extends Error {
  override name = 'DeadlineMissed';
  readonly code = '08006';
}

const LONGER: unique symbol = Symbol('sarsen.deadline');
const clientDeadlines = new WeakMap<pg.Client, number>();

/**
 * A statement that may take longer than its connection's deadline by design (a lock another
 * process holds for a long pass, a migration): `ms` bounds it instead.
 */
export function longerDeadline<T extends pg.QueryConfig>(config: T, ms: number): T {
  return { ...config, [LONGER]: ms };
}

/** Every statement of `client` is bounded by `ms` (null: its path's deadline again), for a pass of long statements. */
export function setClientDeadline(client: pg.Client | pg.PoolClient, ms: number | null): void {
  if (ms === null) clientDeadlines.delete(client);
  else clientDeadlines.set(client, ms);
}

type Done = (err: Error | null, result?: unknown) => void;

/**
 * `Base` with a deadline on every query and a ping while it LISTENs; `purpose` names it in the
 * warning and the metric when it is discarded.
 */
export function withDeadlines(Base: typeof pg.Client, purpose: string, path: DeadlinePath): typeof pg.Client {
  class DeadlineClient extends Base {
    inFlight = 0;
    discarded = false;
    pinger: NodeJS.Timeout | null = null;
    // When a round trip on this connection last ended (performance.now()).
    answeredAt = 0;

    constructor(config?: string | pg.ClientConfig) {
      super(config);
      this.once('end', () => {
        path.idle.delete(this);
        if (this.pinger) clearTimeout(this.pinger);
        this.pinger = null;
      });
    }

    /** Destroys the connection: every query on it fails, and its pool drops it. */
    discard(err: Error): void {
      if (this.discarded) return;
      this.discarded = true;
      path.idle.delete(this);
      this.connection.stream.destroy(err);
    }

    missed(ms: number): void {
      if (this.discarded) return;
      logger.warn('database connection discarded: a round trip missed its deadline', { purpose, deadline_ms: ms });
      countDiscardedConnection(purpose);
      this.discard(new DeadlineMissed(`Connection terminated: a round trip on a ${purpose} connection missed its ${ms} ms deadline`));
      // The rest of the path is suspect too; callers get fresh connections instead.
      for (const other of [...path.idle]) (other as DeadlineClient).discard(new DeadlineMissed('Connection terminated: discarded with a connection that missed its deadline'));
    }

    /** Arms the deadline of one query; the returned function disarms it. */
    arm(config: unknown): () => void {
      const ms = (config as { [LONGER]?: number } | null)?.[LONGER] ?? clientDeadlines.get(this) ?? path.deadlineMs();
      const text = typeof config === 'string' ? config : (config as { text?: unknown } | null)?.text;
      if (typeof text === 'string' && /^\s*LISTEN\b/i.test(text)) this.listening();
      this.inFlight++;
      const timer = setTimeout(() => this.missed(ms), ms);
      let done = false;
      return () => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        this.inFlight--;
        this.answeredAt = performance.now();
      };
    }

    listening(): void {
      if (this.pinger) return;
      const pace = () => Math.max(LISTENER_PING_MS, path.deadlineMs());
      const next = (ms: number) => {
        this.pinger = setTimeout(ping, ms);
        this.pinger.unref();
      };
      const ping = () => {
        if (this.discarded) return void (this.pinger = null);
        // A round trip in flight is under its own deadline; one that ended lately proved the link.
        const quiet = performance.now() - this.answeredAt;
        if (this.inFlight === 0 && quiet >= pace()) {
          // What fails here fails on the connection: its 'error' tells its owner, who replaces it.
          void this.query('SELECT 1').catch(() => undefined);
          return next(pace());
        }
        next(this.inFlight > 0 ? pace() : pace() - quiet);
      };
      next(pace());
    }
  }

  const query = Base.prototype.query as (this: DeadlineClient, ...args: unknown[]) => unknown;
  DeadlineClient.prototype.query = function (this: DeadlineClient, ...args: unknown[]): unknown {
    const config = args[0];
    // A Submittable (a cursor, a stream) paces itself; it is not armed.
    if (config && typeof (config as { submit?: unknown }).submit === 'function') return query.apply(this, args);
    const disarm = this.arm(config);
    const last = args.length - 1;
    const callback = args[last];
    if (typeof callback === 'function') {
      args[last] = (err: Error | null, result?: unknown) => {
        disarm();
        (callback as Done)(err, result);
      };
      return query.apply(this, args);
    }
    let result: unknown;
    try {
      result = query.apply(this, args);
    } catch (err) {
      disarm();
      throw err;
    }
    if (result instanceof Promise) result.then(disarm, disarm);
    else disarm();
    return result;
  } as typeof Base.prototype.query;
  return DeadlineClient;
}

/** Keeps `path.idle` to the clients `pool` holds idle, so a missed deadline discards them too. */
export function trackIdle(pool: pg.Pool, path: DeadlinePath): void {
  pool.on('release', (err: Error | undefined, client: pg.PoolClient) => {
    if (!err) path.idle.add(client as unknown as pg.Client);
  });
  pool.on('acquire', (client) => path.idle.delete(client as unknown as pg.Client));
  pool.on('remove', (client) => path.idle.delete(client as unknown as pg.Client));
}
