// A request's work in graphile-worker's queue: task `execute_request`, job key = request id, so
// a new job replaces a pending one and retires a dead worker's locked one, and
// `graphile_worker.jobs where key = 'req_…'` finds a request's pending work.
//
// A new request's job is inserted in graphile-worker's private table directly: it is on the hot
// path, where add_jobs would cost more than the request's own rows. (A request run where it was
// accepted has no job: its lease is what recovery goes by.)
// The rest uses graphile-worker's public functions, but for retireJobsSql, staleLockedJobKeysSql
// and ENSURE_TASK_SQL, which none of them does. test/integration/graphile-worker-conformance.test.ts
// holds the direct reads and writes to graphile-worker's own, and fails when its schema moves past
// GRAPHILE_WORKER_MIGRATIONS.

import type { Pool } from './pool.ts';

export const EXECUTE_REQUEST = 'execute_request';
/** graphile-worker's schema migrations (its `graphile_worker.migrations`) the direct writes were written against: 0.18.0's. */
export const GRAPHILE_WORKER_MIGRATIONS = 20;
const MAX_ATTEMPTS = 25;

/**
 * The priority of a re-dispatched attempt's job. graphile-worker hands out lower numbers first:
 * a recovery is work somebody may be following, so it goes ahead of a backlog of new requests
 * (priority 0), and the task runs it without yielding to acceptance.
 */
export const RECOVERY_PRIORITY = -1;

/** SQL calling add_job for the request id that `id` (an SQL expression) names, due at `runAt` (default now). */
export function enqueueSql(id: string, runAt?: string, priority?: number): string {
  return `graphile_worker.add_job('${EXECUTE_REQUEST}', json_build_object('request_id', ${id}),${runAt ? ` run_at => ${runAt},` : ''}${priority ? ` priority => ${priority},` : ''} job_key => ${id}, max_attempts => ${MAX_ATTEMPTS})`;
}

const TASK_ID = `(SELECT id FROM graphile_worker._private_tasks WHERE identifier = '${EXECUTE_REQUEST}')`;

/**
 * SQL (a data-modifying CTE body) inserting a job per row of `rows` (columns `id`, a new
 * request's, and `run_at`), without waking any worker; yields `key` and `id`. The task's row
 * exists from startup on (`ensureTaskSql`).
 */
export function insertJobsSql(rows: string): string {
  return `INSERT INTO graphile_worker._private_jobs (task_id, payload, run_at, max_attempts, key)
    SELECT ${TASK_ID}, json_build_object('request_id', j.id), j.run_at, ${MAX_ATTEMPTS}, j.id FROM (${rows}) AS j
    RETURNING key, id`;
}

/**
 * SQL (a query) waking an executor for `count` (an SQL expression) jobs due now; nothing when it
 * is 0. One executor's job pool fetches, not every one's (sql/migrations/019_bus_channels.sql).
 */
export function wakeWorkersSql(count: string): string {
  return `SELECT sarsen.wake_executors(n) FROM (SELECT ${count} AS n) AS due WHERE n > 0`;
}

/** SQL (a query of one row, or none) waking an executor for a job per row of `rows`, as wakeWorkersSql; nothing when it has none. */
export function wakeWorkersForSql(rows: string): string {
  return `SELECT sarsen.wake_executors(count(*)) FROM (${rows}) AS due HAVING count(*) > 0`;
}

/**
 * SQL deleting every job of the requests `ids` (a text[] expression) names, locked or not:
 * before a recovery enqueues a request again, so that a dead worker's locked job does not stay
 * behind (add_job would only take its key away and leave the row locked for hours).
 */
export function retireJobsSql(ids: string): string {
  return `DELETE FROM graphile_worker._private_jobs WHERE key = ANY(${ids})`;
}

/**
 * SQL (a query) yielding the `key` of every job locked longer than `lockedForMs` (a double
 * precision SQL expression of milliseconds): the jobs of live work only, whatever the requests hold.
 */
export function staleLockedJobKeysSql(lockedForMs: string): string {
  return `SELECT key FROM graphile_worker._private_jobs WHERE key IS NOT NULL AND locked_at < now() - make_interval(secs => ${lockedForMs} / 1000)`;
}

/**
 * Frees the jobs that the given worker pools and workers (graphile-worker ids, of pools that
 * stopped) still hold, so that a live pool picks them up.
 */
export async function unlockJobs(pool: Pool, lockers: readonly string[]): Promise<void> {
  if (lockers.length === 0) return;
  await pool.query('SELECT graphile_worker.force_unlock_workers($1::text[])', [lockers]);
}

/** Registers the task with graphile-worker (as its worker pools do when they start), so that insertJobsSql finds its row. */
export const ENSURE_TASK_SQL = `INSERT INTO graphile_worker._private_tasks (identifier) VALUES ('${EXECUTE_REQUEST}') ON CONFLICT DO NOTHING`;
