// The one way a request's work is enqueued (DESIGN.md section 7): task `execute_request`, job
// key = request id, so a new job replaces a pending one and retires a dead worker's locked one.

/** SQL calling graphile_worker.add_job for the request id that `id` (an SQL expression) names. */
export function enqueueSql(id: string, runAt?: string): string {
  return `graphile_worker.add_job('execute_request', json_build_object('request_id', ${id}),${runAt ? ` run_at => ${runAt},` : ''} job_key => ${id}, max_attempts => 25)`;
}
