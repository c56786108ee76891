// PostgreSQL connections. Every pool and client gets an error handler: an idle client whose
// server went away must not crash the process (pg emits 'error' on the pool for it).
import pg from 'pg';
import { setTimeout as sleep } from 'node:timers/promises';
import { logger, errorFields } from '../log.ts';

export type ConnectionConfig = Readonly<{
  host: string;
  port: number;
  user: string;
  database: string;
  password?: string;
}>;

export type Pool = pg.Pool;
export type PoolClient = pg.PoolClient;

// Sarsen's own ids and timestamps come back as strings; bigint counters as JS numbers are
// safe well past any realistic byte or token total (2^53).
pg.types.setTypeParser(pg.types.builtins.INT8, (v) => Number(v));

// Named statements (see `prepared`) are planned once per connection. Left to choose,
// PostgreSQL re-plans a batch statement on every call (its custom plan never looks worse than
// the generic one), and planning costs more than running it.
const GENERIC_PLANS = '-c plan_cache_mode=force_generic_plan';
// A generic plan cannot know a batch's size (it guesses ten rows), and joins ten rows to ten
// with a nested loop: quadratic in the batch, 80 ms for 256 terminal writes. Batch statements
// are written so that every table is reached through an index (a key lookup, or `= ANY` of
// the batch's keys) and only the batch's own rows are joined to each other; without nested
// loops those joins are hashed, linear at any size.
// A generic plan is also made once, often while the tables are small (or were analysed while
// empty): it then reaches a table by a sequential scan, and keeps doing so when the table holds
// a backlog of tens of thousands of rows, until something replans it (an autoanalyze, a minute
// or more later; with autovacuum off, never). Sequential scans are off too, so every table is
// reached through its index whatever its size when the plan was made.
// (Disabled plan types add a huge cost to a plan, which would also set off JIT compilation:
// seconds of compiling for a statement that runs in milliseconds.)
const BATCH_PLANS = `${GENERIC_PLANS} -c enable_nestloop=off -c enable_seqscan=off -c jit=off`;

// How long ending a pool waits for its sockets to close.
const CLOSE_WAIT_MS = 5_000;

export function createPool(conn: ConnectionConfig, opts: { max?: number; name?: string; batches?: boolean } = {}): Pool {
  const pool = new pg.Pool({
    ...conn,
    max: opts.max ?? 20,
    idleTimeoutMillis: 30_000,
    connectionTimeoutMillis: 10_000,
    application_name: opts.name ?? 'sarsen',
    options: opts.batches ? BATCH_PLANS : GENERIC_PLANS,
  });
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
    open.add(client);
    client.once('end', () => open.delete(client));
    client.on('error', (err) => {
      if (!pool.ending) connectionFailed('database connection failed', err);
    });
  });
  // pg's pool.query closes the connection after any error, even one the server reported for
  // the statement alone (a unique violation, text it refused, a constraint): the next query then
  // pays for a new connection and its prepared statements again (30 ms on a busy machine, every
  // time a caller's input is refused). A statement's ERROR leaves the connection as it was;
  // only a connection fault (FATAL, lost socket) closes it.
  pool.query = (async (config: string | pg.QueryConfig, values?: unknown[]) => {
    const client = await pool.connect();
    try {
      const result = await client.query(config, values);
      client.release();
      return result;
    } catch (err) {
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

export function createClient(conn: ConnectionConfig, name = 'sarsen'): pg.Client {
  const client = new pg.Client({ ...conn, application_name: name, connectionTimeoutMillis: 10_000 });
  client.on('error', (err) => connectionFailed('database connection failed', err));
  return client;
}

/**
 * The connections of one group-committing writer (submissions, claims, terminal writes,
 * frames), one per lane of its batcher: they run that writer's batch statements only, with
 * batch plans (see above), and never wait behind request traffic for a connection.
 */
export function createBatchPool(conn: ConnectionConfig, name: string, lanes = 1): Pool {
  return createPool(conn, { max: lanes, name, batches: true });
}

/** Runs `fn` in a transaction on one pooled client; rolls back on any throw. */
export async function withTransaction<T>(pool: Pool, fn: (client: PoolClient) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
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
    // connect now), or a socket error from Node.
    return /^(08|57P0[123]$)|^(ECONNRESET|ECONNREFUSED|EPIPE|ETIMEDOUT|EHOSTUNREACH|ENETUNREACH|EAI_AGAIN)$/.test(code);
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
