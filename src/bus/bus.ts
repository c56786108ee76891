// The event bus: one LISTEN connection per process on channel `sarsen_events`, fanned out in
// memory. Two kinds of message travel on it: control messages routed by their key `k`
// (`settings`, `api-key`, `routing`, from triggers and administration routes), and request
// events (src/db/events.ts) routed by request id. NOTIFY is not replayed after a reconnect,
// so subscribers also register `onReconnect` to re-read the database. Events produced in this
// process are delivered in memory by their producer (`publishRequest`, `publishLocal`), with
// their frames or answer attached; the NOTIFY echo of them is dropped.
import type pg from 'pg';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ConnectionConfig } from '../db/pool.ts';
import { createClient, connectionFailed, databaseReached } from '../db/pool.ts';
import { CHANNEL, JOIN_BUS, LEAVE_BUS, busConnectionName, decodeRequestEvents, type RequestEvent } from '../db/events.ts';
import { logger, errorFields } from '../log.ts';
import { countBusReconnect } from '../metrics/metrics.ts';

export { CHANNEL };

// Reconnect backoff ceiling: a database that is back is heard from within a second.
const MAX_RECONNECT_MS = 1000;
// How long closing waits for the bus's row to be removed.
const LEAVE_WAIT_MS = 1000;

/** A control message; `k` is its routing key (`settings`, `api-key`, `routing`). */
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

/** `origin` names this process in the NOTIFYs its statements send (see src/db/events.ts). */
export function createBus(conn: ConnectionConfig, opts: { origin: string; onConnect?: (client: pg.Client) => Promise<void> }): Bus {
  const control = fanOut<string, BusMessage>();
  const requests = fanOut<string, RequestEvent>();
  const reconnectHandlers = new Set<() => void>();
  let client: pg.Client | null = null;
  let closed = false;
  let everConnected = false;
  let retryTimer: NodeJS.Timeout | null = null;
  let resolveReady!: () => void;
  const readyPromise = new Promise<void>((r) => (resolveReady = r));

  const connect = async (delayMs: number): Promise<void> => {
    if (closed) return;
    const c = createClient(conn, busConnectionName(opts.origin));
    c.on('notification', (n) => {
      if (n.channel !== CHANNEL || !n.payload) return;
      const events = decodeRequestEvents(n.payload, opts.origin);
      if (events !== null) {
        for (const ev of events) requests.deliver(ev.requestId, ev);
        return;
      }
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
      c.end().catch(() => undefined);
      if (!closed) schedule(Math.min(Math.max(delayMs * 2, 100), MAX_RECONNECT_MS));
    };
    c.on('error', lost);
    c.on('end', lost);
    try {
      await c.connect();
      await c.query(`LISTEN ${CHANNEL}`);
      // Every statement that found no listener but this process's has committed (see
      // src/db/events.ts): from here on, what it missed can be read from the database.
      await c.query(JOIN_BUS);
      await opts.onConnect?.(c);
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
    onRequest: (requestId, handler) => requests.add(requestId, handler),
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
      control.clear();
      requests.clear();
      reconnectHandlers.clear();
      if (!c) return;
      // Other processes stop notifying this one (if this fails, a reconcile forgets it later).
      await Promise.race([c.query(LEAVE_BUS, [opts.origin]).catch(() => undefined), sleep(LEAVE_WAIT_MS, undefined, { ref: false })]);
      await c.end().catch(() => undefined);
    },
  };
}
