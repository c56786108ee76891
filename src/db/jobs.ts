// A request's work in graphile-worker's queue (DESIGN.md section 7): task `execute_request`,
// job key = request id, so a new job replaces a pending one and retires a dead worker's locked
// one, and `graphile_worker.jobs where key = 'req_…'` finds a request's pending work. Only
// graphile-worker's public functions are called.

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

/** SQL (a FROM item) deleting the jobs whose ids `ids` (a bigint[] expression) names, unless a worker holds them. */
export function completeJobsSql(ids: string): string {
  return `graphile_worker.complete_jobs(${ids})`;
}

/** SQL (a FROM item) moving unlocked jobs `ids` (a bigint[] expression) to `runAt`. */
export function rescheduleJobsSql(ids: string, runAt: string): string {
  return `graphile_worker.reschedule_jobs(${ids}, run_at => ${runAt})`;
}
