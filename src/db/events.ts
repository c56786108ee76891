// Request events (docs/durability.md "Events"): what readers of a request wait for. One typed union,
// one SQL encoder (every statement that changes a request NOTIFYs through `notifyEvents`) and
// one decoder (the bus reads payloads with `decodeRequestEvents`), so the wire format lives in
// one place. Events a process produced are delivered to its own readers in memory, with the
// frames or the answer attached; a NOTIFY carries only ids, sequence numbers and states, and
// names the process it came from so that process can ignore its own echo.
//
// A NOTIFY goes only to the processes that read the request (sql/migrations/019_bus_channels.sql):
// the one that accepted it, named by the tag its id ends in, and those registered as readers.
import type pg from 'pg';
import type { Answer, ChunkRow, RequestStatus } from './requests.ts';
import type { Pool } from './pool.ts';
import { requestTag } from '../core/ids.ts';

/** The channel every bus listens on: control messages, cancels, and an earlier release's events. */
export const CHANNEL = 'sarsen_events';

/** The channel of the process(es) whose request ids end in `tag`. */
export const tagChannel = (tag: string): string => `${CHANNEL}_${tag.toLowerCase()}`;

/** The channel a request's events reach its accepting process on. */
export const requestChannel = (requestId: string): string => tagChannel(requestTag(requestId));

export type RequestEvent =
  /** Frames up to `seq` are committed. `frames` (in memory, same process only): those frames. */
  | { type: 'frames'; requestId: string; seq: number; frames?: readonly ChunkRow[] }
  /** The request moved to `status`. `answer` (in memory, same process only): its terminal answer. */
  | { type: 'state'; requestId: string; status: RequestStatus; answer?: Answer }
  /** The attempt readers were following was discarded (its worker died or handed it back). */
  | { type: 'superseded'; requestId: string }
  /** A cancel was asked for: the process holding the request's attempt aborts it. */
  | { type: 'cancel'; requestId: string }
  /**
   * This process may have missed news of the request (it just registered as a reader, after
   * reading the database concurrently with a statement that did not see it yet): read it again.
   */
  | { type: 'news'; requestId: string };

// Wire format: `R <origin> [[request id, code, argument], ...]` (at most 100 events a payload,
// assembled by sarsen.bus_notify()). Control messages on the shared channel are JSON objects,
// so the first byte tells them apart, and a process can drop its own echo by the prefix alone,
// without parsing it.
const CODE = { frames: 'f', state: 's', superseded: 'x', cancel: 'c' } as const;

/**
 * The application_name of a process's bus connection, by which sarsen.bus_reconcile() knows a
 * bus is still connected (sql/migrations/017_bus_members.sql).
 */
export const busConnectionName = (origin: string): string => `sarsen-bus ${origin}`;

/** The bus connection `c` listens on the shared channel and on its process's own, `ownChannel`. */
export async function listenBus(c: pg.Client, ownChannel: string): Promise<void> {
  await c.query(`LISTEN ${CHANNEL}; LISTEN "${ownChannel}"`);
}

/**
 * Run once a bus LISTENs, before it reports itself connected: registers the bus with its
 * process's `tag` and whether it `executes`, after every statement that looked for listeners
 * without seeing it has committed.
 */
export async function joinBus(c: pg.Client, tag: string, executes: boolean): Promise<void> {
  await c.query('SELECT sarsen.bus_join($1::text, $2::boolean)', [tag.toLowerCase(), executes]);
}

/**
 * Tells every process that work runs here (src/executor/activity.ts): `{"k":"work"}` on the shared
 * channel. A named statement: a process running attempts sends it every few seconds.
 */
export async function announceWork(pool: Pool): Promise<void> {
  await pool.query({ name: 'announce_work', text: `SELECT pg_notify('${CHANNEL}', '{"k":"work"}')` });
}

/** The jobs a `J <count>` payload (sarsen.wake_executors()) announces; null for any other payload. */
export function decodeJobWake(payload: string): number | null {
  if (!payload.startsWith('J ')) return null;
  const n = Number(payload.slice(2));
  return Number.isSafeInteger(n) && n > 0 ? n : null;
}

/** Run as a bus closes: statements stop notifying process `origin`. */
export async function leaveBus(c: pg.Client, origin: string): Promise<void> {
  await c.query(
    `WITH unread AS (DELETE FROM sarsen.bus_readers WHERE process_id = $1)
  DELETE FROM sarsen.bus_members WHERE process_id = $1`,
    [origin],
  );
}

/**
 * Registers process `origin` as a reader of requests `add` and no longer of `drop`: once it
 * returns, every statement that produced events for `add` without notifying `origin` has committed.
 */
export async function followRequests(c: pg.Client, origin: string, add: readonly string[], drop: readonly string[]): Promise<void> {
  await c.query('SELECT sarsen.bus_follow($1::text, $2::text[], $3::text[])', [origin, add, drop]);
}

/**
 * Forgets the buses whose connection is gone (a process killed, a connection cut), so that
 * statements stop notifying nobody, and registers any connected bus not yet registered.
 */
export async function reconcileBuses(pool: Pool): Promise<void> {
  await pool.query('SELECT sarsen.bus_reconcile()');
}

/**
 * SQL (a SELECT, for a CTE) that NOTIFYs request events to the processes that read them. `rows`
 * is a query yielding `request_id`, `event` ('frames', 'state', 'superseded' or 'cancel') and
 * `arg` (the sequence number or the status, as text); `origin` is the SQL of the producing
 * process's id. Nothing is sent to the producer itself: it delivers to its own readers in memory.
 */
export function notifyEvents(rows: string, origin: string): string {
  const code = `CASE ev.event WHEN 'frames' THEN '${CODE.frames}' WHEN 'state' THEN '${CODE.state}' WHEN 'cancel' THEN '${CODE.cancel}' ELSE '${CODE.superseded}' END`;
  return `SELECT sarsen.bus_notify(${origin}::text, array_agg(ev.request_id), array_agg(${code}), array_agg(ev.arg::text)) FROM (${rows}) AS ev`;
}

const STATUSES: readonly string[] = ['pending', 'running', 'succeeded', 'failed'];

/**
 * The request events of a NOTIFY payload; null when it carries none (a control message). A
 * payload `self` produced is answered with no events: its producer delivered them in memory.
 */
export function decodeRequestEvents(payload: string, self: string): RequestEvent[] | null {
  if (!payload.startsWith('R ')) return null;
  const at = payload.indexOf(' ', 2);
  if (at === -1 || payload.slice(2, at) === self) return [];
  let entries: unknown;
  try {
    entries = JSON.parse(payload.slice(at + 1));
  } catch {
    return [];
  }
  const events: RequestEvent[] = [];
  if (!Array.isArray(entries)) return events;
  for (const entry of entries) {
    if (!Array.isArray(entry) || typeof entry[0] !== 'string') continue;
    const [requestId, code, arg] = entry as [string, unknown, unknown];
    if (code === CODE.frames && Number.isInteger(Number(arg))) events.push({ type: 'frames', requestId, seq: Number(arg) });
    else if (code === CODE.state && typeof arg === 'string' && STATUSES.includes(arg)) {
      events.push({ type: 'state', requestId, status: arg as RequestStatus });
    } else if (code === CODE.superseded) events.push({ type: 'superseded', requestId });
    else if (code === CODE.cancel) events.push({ type: 'cancel', requestId });
  }
  return events;
}
