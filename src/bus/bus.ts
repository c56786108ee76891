// The event bus: one LISTEN connection per process, fanned out in memory. Two kinds of message
// travel on it: control messages routed by their key `k` (`settings`, `api-key`, `routing`,
// from triggers and administration routes) on the shared channel `sarsen_events`, and request
// events (src/db/events.ts) routed by request id, on the process's own channel (named by the
// tag its request ids end in). NOTIFY is not replayed after a reconnect, so subscribers also
// register `onReconnect` to re-read the database. Events produced in this process are
// delivered in memory by their producer (`publishRequest`, `publishLocal`), with their frames
// or answer attached; the NOTIFY echo of them is dropped.
//
// A process with the API role reads requests other processes accepted (an identical body that
// attached, a replay by id): the first subscriber to such a request registers the process as
// its reader (so the events come here too), the last one to leave unregisters it. Registering
// happens on the bus connection, batched, and is followed by a `news` event to the request's
// subscribers: whatever committed while they read the database and registered, they read again.
import type pg from 'pg';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ConnectionConfig } from '../db/pool.ts';
import { createClient, connectionFailed, databaseReached } from '../db/pool.ts';
import {
  CHANNEL, busConnectionName, decodeJobWake, decodeRequestEvents, followRequests, joinBus, leaveBus, listenBus, tagChannel, type RequestEvent,
} from '../db/events.ts';
import { PROCESS_TAG, requestTag } from '../core/ids.ts';
import { logger, errorFields } from '../log.ts';
import { countBusReconnect } from '../metrics/metrics.ts';

export { CHANNEL };

// Reconnect backoff ceiling: a database that is back is heard from within a second.
const MAX_RECONNECT_MS = 1000;
// How long closing waits for the bus's row to be removed.
const LEAVE_WAIT_MS = 1000;

/** A control message; `k` is its routing key (`settings`, `api-key`, `routing`; `jobs`: `{ count }` new jobs to fetch). */
export type BusMessage = { k: string; [field: string]: unknown };
type Handler = (msg: BusMessage) => void;
type RequestHandler = (ev: RequestEvent) => void;

export type Bus = {
  subscribe(key: string, handler: Handler): () => void;
  publishLocal(msg: BusMessage): void;
  /** Events of one request, from this process (in memory) and from others (NOTIFY). */
  onRequest(requestId: string, handler: RequestHandler): () => void;
  /** Delivers a request event to this process's subscribers (its producer also NOTIFYs it). */
  publishRequest(ev: RequestEvent): void;
  onReconnect(handler: () => void): () => void;
  /** Resolves once the LISTEN connection is up (the first time). */
  ready(): Promise<void>;
  close(): Promise<void>;
};

function fanOut<K, E>() {
  const handlers = new Map<K, Set<(e: E) => void>>();
  return {
    add(key: K, handler: (e: E) => void): () => void {
      let set = handlers.get(key);
      if (!set) handlers.set(key, (set = new Set()));
      set.add(handler);
      return () => {
        set.delete(handler);
        if (set.size === 0 && handlers.get(key) === set) handlers.delete(key);
      };
    },
    deliver(key: K, e: E): void {
      const set = handlers.get(key);
      if (!set) return;
      for (const h of set) {
        try {
          h(e);
        } catch (err) {
          logger.error('bus subscriber failed', errorFields(err));
        }
      }
    },
    clear: () => handlers.clear(),
  };
}

/**
 * `origin` names this process in the NOTIFYs its statements send (see src/db/events.ts).
 * `follows` (default true): subscribers may read requests other processes accepted (the API
 * role); an executor's subscribers only ever wait for cancels, which reach every process.
 * `executes`: the process runs jobs, and may be told of new ones (`jobs` messages).
 */
export function createBus(
  conn: ConnectionConfig,
  opts: { origin: string; follows?: boolean; executes?: boolean; onConnect?: (client: pg.Client) => Promise<void> },
): Bus {
  const control = fanOut<string, BusMessage>();
  const requests = fanOut<string, RequestEvent>();
  const reconnectHandlers = new Set<() => void>();
  const ownChannel = tagChannel(PROCESS_TAG);
  const readers = createReaders(opts.origin, opts.follows ?? true, (ids) => {
    for (const requestId of ids) requests.deliver(requestId, { type: 'news', requestId });
  });
  let client: pg.Client | null = null;
  let closed = false;
  let everConnected = false;
  let retryTimer: NodeJS.Timeout | null = null;
  let resolveReady!: () => void;
  const readyPromise = new Promise<void>((r) => (resolveReady = r));

  const connect = async (delayMs: number): Promise<void> => {
    if (closed) return;
    const c = createClient(conn, busConnectionName(opts.origin), 'bus');
    c.on('notification', (n) => {
      if ((n.channel !== CHANNEL && n.channel !== ownChannel) || !n.payload) return;
      const events = decodeRequestEvents(n.payload, opts.origin);
      if (events !== null) {
        for (const ev of events) requests.deliver(ev.requestId, ev);
        return;
      }
      const jobs = decodeJobWake(n.payload);
      if (jobs !== null) return control.deliver('jobs', { k: 'jobs', count: jobs });
      let msg: BusMessage;
      try {
        msg = JSON.parse(n.payload) as BusMessage;
      } catch {
        return;
      }
      if (typeof msg.k === 'string') control.deliver(msg.k, msg);
    });
    const lost = () => {
      if (client !== c) return;
      client = null;
      readers.detach();
      c.end().catch(() => undefined);
      if (!closed) schedule(Math.min(Math.max(delayMs * 2, 100), MAX_RECONNECT_MS));
    };
    c.on('error', lost);
    c.on('end', lost);
    try {
      await c.connect();
      await listenBus(c, ownChannel);
      // Every statement that found no listener but this process's has committed (see
      // src/db/events.ts): from here on, what it missed can be read from the database.
      await joinBus(c, PROCESS_TAG, opts.executes ?? false);
      await opts.onConnect?.(c);
      // The readers registered before (a reconnect: the rows may be gone with the connection).
      await readers.attach(c);
      if (closed) {
        await c.end();
        return;
      }
      client = c;
    } catch (err) {
      connectionFailed('event bus could not connect; retrying', err);
      c.removeAllListeners('end');
      await c.end().catch(() => undefined);
      schedule(Math.min(Math.max(delayMs * 2, 100), MAX_RECONNECT_MS));
      return;
    }
    databaseReached();
    if (everConnected) {
      logger.info('event bus reconnected');
      countBusReconnect();
      for (const h of reconnectHandlers) h();
    }
    everConnected = true;
    resolveReady();
  };

  const schedule = (delayMs: number) => {
    if (closed || retryTimer) return;
    retryTimer = setTimeout(() => {
      retryTimer = null;
      void connect(delayMs);
    }, delayMs);
  };

  void connect(0);

  return {
    subscribe: (key, handler) => control.add(key, handler),
    publishLocal: (msg) => control.deliver(msg.k, msg),
    onRequest(requestId, handler) {
      const remove = requests.add(requestId, handler);
      const unfollow = requestTag(requestId) === PROCESS_TAG ? null : readers.follow(requestId);
      return () => {
        remove();
        unfollow?.();
      };
    },
    publishRequest: (ev) => requests.deliver(ev.requestId, ev),
    onReconnect(handler) {
      reconnectHandlers.add(handler);
      return () => reconnectHandlers.delete(handler);
    },
    ready: () => readyPromise,
    async close() {
      closed = true;
      if (retryTimer) clearTimeout(retryTimer);
      retryTimer = null;
      const c = client;
      client = null;
      readers.detach();
      control.clear();
      requests.clear();
      reconnectHandlers.clear();
      if (!c) return;
      // Other processes stop notifying this one (if this fails, a reconcile forgets it later).
      await Promise.race([leaveBus(c, opts.origin).catch(() => undefined), sleep(LEAVE_WAIT_MS, undefined, { ref: false })]);
      await c.end().catch(() => undefined);
    },
  };
}

// A subscriber registers its process as a reader only once it has stayed this long: most
// replays of a settled request are over by then and need no events. (What it misses meanwhile
// it reads on the `news` that follows the registration.)
const FOLLOW_AFTER_MS = 25;
// How long a request stays registered after its last subscriber left: a caller that reconnects
// or reads it again soon costs no new registration.
const UNFOLLOW_AFTER_MS = 2_000;

type Readers = {
  /** A subscriber of request `id` arrived; the returned function says it left. */
  follow(id: string): () => void;
  /** The bus connected: register every request followed, and from now on each as it comes. */
  attach(c: pg.Client): Promise<void>;
  /** The bus lost its connection. */
  detach(): void;
};

/**
 * The requests this process reads that another process accepted, kept registered in
 * sarsen.bus_readers through the bus connection (one statement for what arrived meanwhile).
 * `registered(ids)` is told once registrations committed.
 */
function createReaders(origin: string, enabled: boolean, registered: (ids: string[]) => void): Readers {
  const count = new Map<string, number>(); // subscribers now, by request
  const leaving = new Map<string, NodeJS.Timeout>(); // registered, no subscriber left
  const adding = new Set<string>();
  const dropping = new Set<string>();
  let client: pg.Client | null = null;
  let timer: NodeJS.Timeout | null = null;
  let flushing = false;

  const schedule = () => {
    if (timer || flushing || !client || (adding.size === 0 && dropping.size === 0)) return;
    timer = setTimeout(() => void flush(), FOLLOW_AFTER_MS);
    timer.unref();
  };
  const flush = async (): Promise<void> => {
    timer = null;
    const c = client;
    if (!c) return;
    flushing = true;
    const add = [...adding];
    const drop = [...dropping];
    adding.clear();
    dropping.clear();
    try {
      await followRequests(c, origin, add, drop);
      registered(add.filter((id) => count.has(id)));
    } catch (err) {
      // Registered again, all of them, once the bus reconnects; the subscribers read again then.
      if (client === c) connectionFailed('could not register as a reader of requests', err);
    } finally {
      flushing = false;
    }
    schedule();
  };

  return {
    follow(id) {
      if (!enabled) return () => {};
      const n = count.get(id) ?? 0;
      count.set(id, n + 1);
      const lingering = leaving.get(id);
      if (lingering) {
        clearTimeout(lingering); // still registered
        leaving.delete(id);
      } else if (n === 0 && !dropping.delete(id)) {
        adding.add(id);
        schedule();
      }
      let left = false;
      return () => {
        if (left) return;
        left = true;
        const rest = count.get(id)! - 1;
        if (rest > 0) return void count.set(id, rest);
        count.delete(id);
        if (adding.delete(id)) return; // never registered
        const linger = setTimeout(() => {
          leaving.delete(id);
          dropping.add(id);
          schedule();
        }, UNFOLLOW_AFTER_MS);
        linger.unref();
        leaving.set(id, linger);
      };
    },
    async attach(c) {
      client = null;
      // The rows of an earlier connection may be gone (forgotten with it, or a new primary):
      // everything followed now is registered before the bus reports itself connected.
      const all = [...count.keys()];
      adding.clear();
      dropping.clear();
      if (all.length > 0) await followRequests(c, origin, all, []);
      client = c;
    },
    detach() {
      client = null;
      if (timer) clearTimeout(timer);
      timer = null;
    },
  };
}
