// PostgreSQL connections. Every pool and client gets an error handler: an idle client whose
// server went away must not crash the process (pg emits 'error' on the pool for it).
import pg from 'pg';
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
// (Disabled nested loops add a huge cost to a plan, which would also set off JIT compilation:
// seconds of compiling for a statement that runs in milliseconds.)
const BATCH_PLANS = `${GENERIC_PLANS} -c enable_nestloop=off -c jit=off`;

export function createPool(conn: ConnectionConfig, opts: { max?: number; name?: string; batches?: boolean } = {}): Pool {
  const pool = new pg.Pool({
    ...conn,
    max: opts.max ?? 20,
    idleTimeoutMillis: 30_000,
    connectionTimeoutMillis: 10_000,
    application_name: opts.name ?? 'sarsen',
    options: opts.batches ? BATCH_PLANS : GENERIC_PLANS,
  });
  pool.on('error', (err) => logger.warn('idle database connection failed', errorFields(err)));
  pool.on('connect', (client) => {
    client.on('error', (err) => logger.warn('database connection failed', errorFields(err)));
  });
  return pool;
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
  client.on('error', (err) => logger.warn('database connection failed', errorFields(err)));
  return client;
}

/**
 * The connection of one group-committing writer (submissions, claims, terminal writes, frames):
 * it runs that writer's batch statements only, one at a time, with batch plans (see above), and
 * never waits behind request traffic for a connection.
 */
export function createBatchPool(conn: ConnectionConfig, name: string): Pool {
  return createPool(conn, { max: 1, name, batches: true });
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
  const code = (err as { code?: unknown }).code;
  if (typeof code === 'string') return code.startsWith('08') || code === '57P01' || code === '57P02' || code === '57P03';
  const message = err instanceof Error ? err.message : '';
  return /Connection terminated|connection.*(closed|ended)|ECONNRESET|ECONNREFUSED|Client has encountered a connection error/i.test(message);
}

/**
 * Runs `fn` and, if the connection died under it, once more. Callers use it only for writes
 * that are safe to repeat: fenced ones (a repeat after a commit whose answer was lost finds the
 * fence closed and reports it) and claims (a repeat attaches to what the first one made).
 */
export async function retryOnConnectionLoss<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (!isConnectionLoss(err)) throw err;
    await new Promise((r) => setTimeout(r, 50));
    return fn();
  }
}
