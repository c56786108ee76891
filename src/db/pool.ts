// PostgreSQL connections. Every pool and client gets an error handler: an idle client whose
// server went away must not crash the process (pg emits 'error' on the pool for it).
import pg from 'pg';
import { setTimeout as sleep } from 'node:timers/promises';
import { logger, errorFields } from '../log.ts';
import type { ConnectionBudget, Purpose } from '../core/connection-budget.ts';
import { writableClient, singleHost } from './writable-host.ts';
import { createDeadlinePath, trackIdle, withDeadlines, type DeadlinePath } from './deadlines.ts';

/** Where a connection is counted: a budgeted purpose, or `other` (startup migrations, host probes). */
export type CountedPurpose = Purpose | 'other';

/**
 * The connections of one Sarsen process: its budget, what is open now by purpose, and the pool
 * its writers share. Carried on its ConnectionConfig, so every part built from that config
 * draws from the same budget.
 */
type ProcessConnections = {
  id: string;
  budget: ConnectionBudget;
  open: Record<CountedPurpose, number>;
  writers: { pool: Pool; refs: number } | null;
  /** The deadline every connection of the process keeps, and its idle ones (src/db/deadlines.ts). */
  path: DeadlinePath;
};

const PROCESS: unique symbol = Symbol('sarsen.process-connections');

export type ConnectionConfig = Readonly<{
  /** One host, or several (libpq's `host1:port1,host2:port2`): connections go to the writable one. */
  host: string;
  port: number;
  user: string;
  database: string;
  password?: string;
  readonly [PROCESS]?: ProcessConnections;
}>;

export type Pool = pg.Pool;
export type PoolClient = pg.PoolClient;

// Sarsen's own ids and timestamps come back as strings; bigint counters as JS numbers are
// safe well past any realistic byte or token total (2^53).
pg.types.setTypeParser(pg.types.builtins.INT8, (v) => Number(v));

// Named statements (see `prepared`) are planned once per connection, and never compiled by JIT
// (docs/decisions.md "No JIT"); batch connections also plan without nested loops or sequential
// scans, so a batch costs the same per row at any size (docs/decisions.md "Batch statements plan
// without nested loops or sequential scans").
//
// Every session also has the server watch its peer (docs/operations.md "When the network goes
// silent"): TCP keepalive and tcp_user_timeout on the server's socket, so a server whose client
// vanished ends the session and frees its locks (an executor's liveness lock among them) by
// itself; and a session left idle inside a transaction (its client discarded it mid-way) is ended
// too, so that the row locks it took do not stop everyone else. Node has no tcp_user_timeout for
// the client's own socket: there the deadlines do that work.
const SERVER_WATCHES_PEER =
  '-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3 -c tcp_user_timeout=30000 -c idle_in_transaction_session_timeout=30000';
const EVERY_CONNECTION = `${SERVER_WATCHES_PEER} -c plan_cache_mode=force_generic_plan -c jit=off`;
const BATCH_PLANS = `${EVERY_CONNECTION} -c enable_nestloop=off -c enable_seqscan=off`;
// The client's socket sends keepalive probes once idle this long (the kernel's own interval and count follow).
const KEEPALIVE_IDLE_MS = 10_000;

// How long ending a pool waits for its sockets to close.
const CLOSE_WAIT_MS = 5_000;

/**
 * A config whose pools and clients are those of one process (`id` names them in
 * pg_stat_activity: `sarsen-<purpose> <id>`) and stay within `budget`.
 */
export function processConnections(conn: ConnectionConfig, id: string, budget: ConnectionBudget): ConnectionConfig {
  const open = { main: 0, bus: 0, queue: 0, writers: 0, other: 0 };
  return Object.freeze({ ...withoutProcess(conn), [PROCESS]: { id, budget, open, writers: null, path: createDeadlinePath() } });
}

/** Where a process's connections read their deadline from from now on (the settings, once loaded). */
export function followDeadline(conn: ConnectionConfig, deadlineMs: () => number): void {
  const share = conn[PROCESS];
  if (share) share.path.deadlineMs = deadlineMs;
}

/** The connections a process holds now, by purpose (null: a config no process owns). */
export function openConnections(conn: ConnectionConfig): Readonly<Record<CountedPurpose, number>> | null {
  return conn[PROCESS]?.open ?? null;
}

function withoutProcess(conn: ConnectionConfig): ConnectionConfig {
  const { [PROCESS]: _, ...plain } = conn;
  return plain;
}

/**
 * The pg settings every connection of `conn` starts from: its client class keeps the deadlines
 * of `path` (labelled `purpose` when one is discarded) and connects to the writable host (several
 * hosts: see writable-host.ts).
 */
function pgConfig(conn: ConnectionConfig, purpose: string, path: DeadlinePath) {
  const plain = withoutProcess(conn);
  const Base = writableClient(plain);
  const Client = withDeadlines(Base ?? pg.Client, purpose, path);
  return { ...(Base ? plain : singleHost(plain)), Client, keepAlive: true, keepAliveInitialDelayMillis: KEEPALIVE_IDLE_MS };
}

/** The deadline path of `conn`'s process, or a path of its own for a pool or client no process owns. */
function pathOf(conn: ConnectionConfig): DeadlinePath {
  return conn[PROCESS]?.path ?? createDeadlinePath();
}

/** Counts a connection of `purpose` from when it is established until it ends. */
function counted(conn: ConnectionConfig, purpose: CountedPurpose, client: pg.Client | pg.PoolClient): void {
  const open = conn[PROCESS]?.open;
  if (!open) return;
  open[purpose]++;
  client.once('end', () => open[purpose]--);
}

/**
 * `purpose`: a part of a process's budget (see processConnections); its bound and name then come
 * from the budget. Otherwise `max` (default 20) and `name` (default 'sarsen').
 */
export function createPool(conn: ConnectionConfig, opts: { max?: number; name?: string; batches?: boolean; purpose?: Purpose } = {}): Pool {
  const share = conn[PROCESS];
  const budgeted = share && opts.purpose ? { max: share.budget[opts.purpose], name: `sarsen-${opts.purpose} ${share.id}` } : null;
  const path = pathOf(conn);
  const label = opts.purpose ?? opts.name ?? 'sarsen';
  const pool = new pg.Pool({
    ...pgConfig(conn, label, path),
    max: budgeted?.max ?? opts.max ?? 20,
    idleTimeoutMillis: 30_000,
    application_name: budgeted?.name ?? opts.name ?? 'sarsen',
    options: opts.batches ? BATCH_PLANS : EVERY_CONNECTION,
  });
  // Connecting, and waiting for a connection of a full pool, are bounded by the deadline too, as
  // it is when they start (pg-pool reads this option at each wait and each new connection).
  Object.defineProperty(pool.options, 'connectionTimeoutMillis', { get: () => path.deadlineMs(), enumerable: true });
  trackIdle(pool, path);
  const purpose = opts.purpose ?? 'other';
  // pg's pool.end() resolves once it has asked its connections to close, not once they have:
  // a database stopped right after (embedded PostgreSQL at shutdown) would end them first, and
  // their 'error' would read as an outage. This end() waits for every socket to close, and
  // errors of a pool being ended are not faults.
  const open = new Set<pg.PoolClient>();
  pool.on('error', (err) => {
    if (!pool.ending) connectionFailed('idle database connection failed', err);
  });
  pool.on('connect', (client) => {
    databaseReached();
    counted(conn, purpose, client);
    open.add(client);
    client.once('end', () => open.delete(client));
    client.on('error', (err) => {
      if (!pool.ending) connectionFailed('database connection failed', err);
    });
  });
  // pg's pool.query closes the connection after any error, even one the server reported for
  // the statement alone (a unique violation, text it refused, a constraint): the next query then
  // pays for a new connection and its prepared statements again, every time a caller's input is
  // refused. A statement's ERROR leaves the connection as it was;
  // only a connection fault (FATAL, lost socket) closes it.
  pool.query = (async (config: string | pg.QueryConfig, values?: unknown[]) => {
    const client = await pool.connect();
    try {
      const result = await query(client, config, values);
      client.release();
      return result;
    } catch (err) {
      if (err instanceof Error) Error.captureStackTrace(err); // a stack that leads to the caller, as pg's promise gives it
      client.release(statementError(err) ? undefined : (err as Error));
      throw err;
    }
  }) as typeof pool.query;
  const end = pool.end.bind(pool);
  pool.end = (async () => {
    const closing = [...open].map((client) => new Promise<void>((resolve) => client.once('end', () => resolve())));
    await end();
    // (Bounded: a socket that never reports its close must not hold a shutdown forever.)
    await Promise.race([Promise.all(closing), sleep(CLOSE_WAIT_MS, undefined, { ref: false })]);
  }) as typeof pool.end;
  return pool;
}

// An outage is logged once per process when it begins (warn) and once when a connection
// succeeds again (info), not once per connection or request that meets it.
let unreachable = false;

/**
 * `client.query` through its callback. Through its promise form, query after query, every result
 * stayed reachable until the next full collection: results outlived the young generation and
 * filled the old one (docs/measurements.md "Memory").
 */
function query(client: pg.PoolClient, config: string | pg.QueryConfig, values?: unknown[]): Promise<pg.QueryResult> {
  const run = client.query as (config: string | pg.QueryConfig, values: unknown[] | undefined, done: (err: Error | null, result: pg.QueryResult) => void) => void;
  return new Promise((resolve, reject) => run.call(client, config, values, (err, result) => (err ? reject(err) : resolve(result))));
}

/** Logs a database fault: the first connection loss of an outage as a warning, the rest not at all. */
export function connectionFailed(message: string, err: unknown): void {
  if (!isConnectionLoss(err)) {
    logger.warn(message, errorFields(err));
    return;
  }
  if (unreachable) return;
  unreachable = true;
  logger.warn('database unreachable; retrying until it is back', errorFields(err));
}

/** A connection succeeded: ends an outage, if one was logged. */
export function databaseReached(): void {
  if (!unreachable) return;
  unreachable = false;
  logger.info('database reachable again');
}

/**
 * A named prepared statement for a hot path: PostgreSQL parses and plans it once per
 * connection instead of on every call. `name` must be unique to `text`.
 */
export function prepared(name: string, text: string): (values: unknown[]) => pg.QueryConfig {
  return (values) => ({ name, text, values });
}

/** A single connection (the bus's LISTEN connection, migrations), counted under `purpose`. */
export function createClient(conn: ConnectionConfig, name = 'sarsen', purpose: CountedPurpose = 'other'): pg.Client {
  const path = pathOf(conn);
  const { Client, ...config } = pgConfig(conn, purpose === 'other' ? name : purpose, path);
  const client = new Client({ ...config, application_name: name, connectionTimeoutMillis: path.deadlineMs(), options: SERVER_WATCHES_PEER });
  client.on('error', (err) => connectionFailed('database connection failed', err));
  client.once('connect', () => counted(conn, purpose, client));
  return client;
}

/**
 * The connections of the group-committing writers (submissions, claims, terminal writes,
 * frames): they run batch statements only, with batch plans (see above), and never wait behind
 * request traffic for a connection. In a process (see processConnections) every writer draws
 * from one pool of the budget's `writers` connections, ended with its last writer; `name` and
 * `lanes` then only say what the writer would open alone.
 */
export function createBatchPool(conn: ConnectionConfig, name: string, lanes = 1): Pool {
  const share = conn[PROCESS];
  if (!share) return createPool(conn, { max: lanes, name, batches: true });
  if (!share.writers) {
    const pool = createPool(conn, { purpose: 'writers', batches: true });
    const end = pool.end.bind(pool);
    const writers = { pool, refs: 0 };
    pool.end = (async () => {
      if (--writers.refs > 0) return;
      if (share.writers === writers) share.writers = null;
      await end();
    }) as typeof pool.end;
    share.writers = writers;
  }
  share.writers.refs++;
  return share.writers.pool;
}

/**
 * Holds every connection asked of `pool` until the promise last given to `holdUntil` settles;
 * with none pending, `connect` is pg's own. For a library that takes connections the moment it
 * starts and offers no hook to wait (graphile-worker's first job fetch, src/executor/worker.ts).
 */
export function gateConnections(pool: Pool): { holdUntil(done: Promise<unknown>): void } {
  type Callback = (err: Error | undefined, client: PoolClient | undefined, release: (err?: Error | boolean) => void) => void;
  const connect = pool.connect.bind(pool) as (cb?: Callback) => Promise<PoolClient> | undefined;
  let held: Promise<void> | null = null;
  pool.connect = ((cb?: Callback) => {
    const wait = held;
    if (wait === null) return connect(cb);
    if (cb === undefined) return wait.then(() => connect()!);
    void wait.then(() => connect(cb));
    return undefined;
  }) as typeof pool.connect;
  return {
    holdUntil(done) {
      const settled: Promise<void> = done
        .then(() => undefined, () => undefined)
        .finally(() => {
          if (held === settled) held = null;
        });
      held = settled;
    },
  };
}

/**
 * Runs `fn` in a transaction on one pooled client; rolls back on any throw. `indexed`: its
 * statements may not scan a table whole (the sweeps' lookups, which run every few seconds and
 * must cost what the live work costs, not what the table holds, even before its first ANALYZE).
 */
export async function withTransaction<T>(pool: Pool, fn: (client: PoolClient) => Promise<T>, opts: { indexed?: boolean } = {}): Promise<T> {
  const client = await pool.connect();
  try {
    await client.query(opts.indexed ? 'BEGIN; SET LOCAL enable_seqscan = off' : 'BEGIN');
    const result = await fn(client);
    await client.query('COMMIT');
    return result;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => undefined);
    throw err;
  } finally {
    client.release();
  }
}

/**
 * Whether an error means the connection died under the query (server restart, a terminated
 * backend, a network cut) rather than the query being refused: such a query is worth one
 * more try on a fresh connection.
 */
export function isConnectionLoss(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code === 'string') {
    // SQLSTATE class 08 (connection exception), 57P01-03 (terminated, crash shutdown, cannot
    // connect now), 25006 (a read-only transaction: the server is, or just became, a standby;
    // the write did not happen and belongs on the primary), or a socket error from Node.
    return /^(08|57P0[123]$|25006$)|^(ECONNRESET|ECONNREFUSED|EPIPE|ETIMEDOUT|EHOSTUNREACH|ENETUNREACH|EAI_AGAIN)$/.test(code);
  }
  const message = err instanceof Error ? err.message : '';
  return /Connection terminated|connection.*(closed|ended)|Client has encountered a connection error|timeout exceeded when trying to connect|not queryable/i.test(message);
}

/**
 * An error the server reported for one statement, after which its connection goes on: not a
 * connection fault, nor operator intervention (57P: terminated, timed out), nor one that
 * ended the session (FATAL, PANIC), nor a prepared statement the schema changed under
 * (0A000, "cached plan must not change result type": it would fail again on that connection).
 */
function statementError(err: unknown): boolean {
  if (!(err instanceof pg.DatabaseError) || isConnectionLoss(err) || err.code === '0A000' || err.code?.startsWith('57P')) return false;
  return err.severity !== 'FATAL' && err.severity !== 'PANIC';
}

/**
 * Whether the statement was rolled back as a deadlock's victim (two group commits, or a group
 * commit and a recovery, locking shared rows in different orders): tried again, it runs alone.
 */
export function isDeadlockVictim(err: unknown): boolean {
  return (err as { code?: unknown } | null)?.code === '40P01';
}

/**
 * Runs `fn` and, while the connection dies under it or it is a deadlock's victim, again
 * (backing off) until `forMs` has passed or `signal` aborts; then the last error stands. `onReturn` runs when a try succeeds
 * after a loss (what was announced meanwhile on the bus was not heard). Callers use it only
 * for what is safe to repeat: reads, fenced writes (a repeat after a commit whose answer was
 * lost finds the fence closed and reports it), claims and submissions (a repeat finds what the
 * first one made).
 */
export async function retryTransient<T>(
  fn: () => Promise<T>,
  forMs = 0,
  opts: { signal?: AbortSignal; onReturn?: () => void } = {},
): Promise<T> {
  const deadline = Date.now() + forMs;
  for (let delay = 50, lost = false; ; delay = Math.min(delay * 2, 500)) {
    try {
      const result = await fn();
      if (lost) opts.onReturn?.();
      return result;
    } catch (err) {
      if (!(isConnectionLoss(err) || isDeadlockVictim(err)) || opts.signal?.aborted || (Date.now() + delay > deadline && delay > 50)) throw err;
      lost = true;
      await new Promise((r) => setTimeout(r, delay));
    }
  }
}
