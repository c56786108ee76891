// A request's work in graphile-worker's queue (DESIGN.md section 7): task `execute_request`,
// job key = request id, so a new job replaces a pending one and retires a dead worker's locked
// one, and `graphile_worker.jobs where key = 'req_…'` finds a request's pending work.
//
// Jobs due now go through graphile-worker's public functions, which wake the worker pools.
// The backstop job of an attempt claimed at acceptance (due when its lease ends; see
// submissions.ts) is written to and removed from graphile-worker's job table directly: that
// happens twice per request on the hot path, and add_jobs would wake every worker pool for
// a job nobody can take yet (a NOTIFY, then a fetch per pool) and cost more than the request's
// own rows. The columns written are those add_jobs writes; the integration tests read the
// result back through graphile-worker's public `jobs` view.

import type { Pool } from './pool.ts';

export const EXECUTE_REQUEST = 'execute_request';
const MAX_ATTEMPTS = 25;

/** SQL calling add_job for the request id that `id` (an SQL expression) names, due at `runAt` (default now). */
export function enqueueSql(id: string, runAt?: string): string {
  return `graphile_worker.add_job('${EXECUTE_REQUEST}', json_build_object('request_id', ${id}),${runAt ? ` run_at => ${runAt},` : ''} job_key => ${id}, max_attempts => ${MAX_ATTEMPTS})`;
}

/**
 * SQL (a FROM item) adding one job per row of `rows` (columns `id`, `run_at`; NULL is now) in
 * one call, yielding the jobs. graphile-worker NOTIFYs its workers once per call, even for an
 * empty set: callers skip the call when there are no rows.
 */
export function addJobsSql(rows: string): string {
  return `graphile_worker.add_jobs(ARRAY(
    SELECT ROW('${EXECUTE_REQUEST}', json_build_object('request_id', j.id), NULL, j.run_at, ${MAX_ATTEMPTS}, j.id, NULL, NULL)::graphile_worker.job_spec
      FROM (${rows}) AS j))`;
}

/** SQL (a FROM item) moving unlocked jobs `ids` (a bigint[] expression) to `runAt`. */
export function rescheduleJobsSql(ids: string, runAt: string): string {
  return `graphile_worker.reschedule_jobs(${ids}, run_at => ${runAt})`;
}

const TASK_ID = `(SELECT id FROM graphile_worker._private_tasks WHERE identifier = '${EXECUTE_REQUEST}')`;

/**
 * SQL (a data-modifying CTE body) inserting a backstop job per row of `rows` (columns `id`,
 * `run_at`), without waking any worker; yields `key` and `id`. The task's row exists from
 * startup on (`ensureTaskSql`).
 */
export function insertBackstopJobsSql(rows: string): string {
  return `INSERT INTO graphile_worker._private_jobs (task_id, payload, run_at, max_attempts, key)
    SELECT ${TASK_ID}, json_build_object('request_id', j.id), j.run_at, ${MAX_ATTEMPTS}, j.id FROM (${rows}) AS j
    RETURNING key, id`;
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
