// A request's work in graphile-worker's queue (DESIGN.md section 7): task `execute_request`,
// job key = request id, so a new job replaces a pending one and retires a dead worker's locked
// one, and `graphile_worker.jobs where key = 'req_…'` finds a request's pending work.
//
// A new request's job (due now, or, for an attempt claimed at acceptance, the backstop due when
// its lease ends; see submissions.ts) is written to graphile-worker's job table directly, and
// its backstop removed directly: that happens on the hot path, and add_jobs costs more than
// the request's own rows. Its first step, taking the key from a locked job, is a scan of the
// whole job table per call (a generic plan over its `unnest`), which grows with every job
// waiting; a new request's key is new, so that step and add_jobs's upsert have nothing to do.
// The columns written are those add_jobs writes, and due jobs send the NOTIFY it sends, which
// wakes the worker pools. Recoveries and retries, rare and with keys that may be taken, go
// through graphile-worker's public functions. The integration tests read jobs back through
// graphile-worker's public `jobs` view.

import type { Pool } from './pool.ts';

export const EXECUTE_REQUEST = 'execute_request';
const MAX_ATTEMPTS = 25;

/** SQL calling add_job for the request id that `id` (an SQL expression) names, due at `runAt` (default now). */
export function enqueueSql(id: string, runAt?: string): string {
  return `graphile_worker.add_job('${EXECUTE_REQUEST}', json_build_object('request_id', ${id}),${runAt ? ` run_at => ${runAt},` : ''} job_key => ${id}, max_attempts => ${MAX_ATTEMPTS})`;
}

/** SQL (a FROM item) moving unlocked jobs `ids` (a bigint[] expression) to `runAt`. */
export function rescheduleJobsSql(ids: string, runAt: string): string {
  return `graphile_worker.reschedule_jobs(${ids}, run_at => ${runAt})`;
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

/** SQL (a query) waking the worker pools for `count` (an SQL expression) jobs due now, as add_jobs does; nothing when it is 0. */
export function wakeWorkersSql(count: string): string {
  return `SELECT pg_notify('jobs:insert', json_build_object('r', random(), 'count', n)::text) FROM (SELECT ${count} AS n) AS due WHERE n > 0`;
}

/** SQL (a data-modifying CTE body) removing the backstop jobs `ids` (a bigint[] expression) names, unless a worker holds them. */
export function removeBackstopJobsSql(ids: string): string {
  return `DELETE FROM graphile_worker._private_jobs AS jobs WHERE jobs.id = ANY(${ids}) AND jobs.locked_at IS NULL RETURNING 1`;
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
 * Frees the jobs that the given worker pools and workers (graphile-worker ids, of pools that
 * stopped) still hold, so that a live pool picks them up.
 */
export async function unlockJobs(pool: Pool, lockers: readonly string[]): Promise<void> {
  if (lockers.length === 0) return;
  await pool.query(
    'UPDATE graphile_worker._private_jobs SET locked_at = NULL, locked_by = NULL WHERE locked_by = ANY($1::text[])',
    [lockers],
  );
}

/** Registers the task with graphile-worker (as its worker pools do when they start), for backstop jobs. */
export const ENSURE_TASK_SQL = `INSERT INTO graphile_worker._private_tasks (identifier) VALUES ('${EXECUTE_REQUEST}') ON CONFLICT DO NOTHING`;
