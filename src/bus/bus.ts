// The event bus: one LISTEN connection per process on channel `sarsen_events`, fanned out in
// memory by routing key. NOTIFY is not replayed after a reconnect, so subscribers also register
// `onReconnect` to re-read the database; events produced in this process can be delivered
// in memory (`publishLocal`) without a round trip.
import type pg from 'pg';
import type { ConnectionConfig } from '../db/pool.ts';
import { createClient } from '../db/pool.ts';
import { logger, errorFields } from '../log.ts';

export const CHANNEL = 'sarsen_events';

/** Every payload carries `k`, its routing key (`settings`, `req:<id>`, ...). */
export type BusMessage = { k: string; [field: string]: unknown };
type Handler = (msg: BusMessage) => void;

export type Bus = {
  subscribe(key: string, handler: Handler): () => void;
  onReconnect(handler: () => void): () => void;
  publishLocal(msg: BusMessage): void;
  /** Resolves once the LISTEN connection is up (the first time). */
  ready(): Promise<void>;
  close(): Promise<void>;
};

export function createBus(conn: ConnectionConfig, opts: { onConnect?: (client: pg.Client) => Promise<void> } = {}): Bus {
  const handlers = new Map<string, Set<Handler>>();
  const reconnectHandlers = new Set<() => void>();
  let client: pg.Client | null = null;
  let closed = false;
  let everConnected = false;
  let retryTimer: NodeJS.Timeout | null = null;
  let resolveReady!: () => void;
  const readyPromise = new Promise<void>((r) => (resolveReady = r));

  const deliver = (msg: BusMessage) => {
    const set = handlers.get(msg.k);
    if (!set) return;
    for (const h of set) {
      try {
        h(msg);
      } catch (err) {
        logger.error('bus subscriber failed', errorFields(err));
      }
    }
  };

  const connect = async (delayMs: number): Promise<void> => {
    if (closed) return;
    const c = createClient(conn, 'sarsen-bus');
    c.on('notification', (n) => {
      if (n.channel !== CHANNEL || !n.payload) return;
      let msg: BusMessage;
      try {
        msg = JSON.parse(n.payload) as BusMessage;
      } catch {
        return;
      }
      if (msg.k === 'chunks' && Array.isArray(msg.r)) {
        // One NOTIFY per chunk-writer flush names many requests: [[request id, newest seq], ...].
        for (const entry of msg.r as unknown[]) {
          if (Array.isArray(entry) && typeof entry[0] === 'string') deliver({ k: `req:${entry[0]}`, seq: entry[1] });
        }
      } else if (typeof msg.k === 'string') deliver(msg);
    });
    const lost = () => {
      if (client !== c) return;
      client = null;
      c.end().catch(() => undefined);
      if (!closed) schedule(Math.min(Math.max(delayMs * 2, 100), 5000));
    };
    c.on('error', lost);
    c.on('end', lost);
    try {
      await c.connect();
      await c.query(`LISTEN ${CHANNEL}`);
      await opts.onConnect?.(c);
      if (closed) {
        await c.end();
        return;
      }
      client = c;
    } catch (err) {
      logger.warn('event bus could not connect; retrying', errorFields(err));
      c.removeAllListeners('end');
      await c.end().catch(() => undefined);
      schedule(Math.min(Math.max(delayMs * 2, 100), 5000));
      return;
    }
    if (everConnected) {
      logger.info('event bus reconnected');
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
    subscribe(key, handler) {
      let set = handlers.get(key);
      if (!set) handlers.set(key, (set = new Set()));
      set.add(handler);
      return () => {
        set.delete(handler);
        if (set.size === 0 && handlers.get(key) === set) handlers.delete(key);
      };
    },
    onReconnect(handler) {
      reconnectHandlers.add(handler);
      return () => reconnectHandlers.delete(handler);
    },
    publishLocal: deliver,
    ready: () => readyPromise,
    async close() {
      closed = true;
      if (retryTimer) clearTimeout(retryTimer);
      retryTimer = null;
      const c = client;
      client = null;
      handlers.clear();
      reconnectHandlers.clear();
      if (c) await c.end().catch(() => undefined);
    },
  };
}
