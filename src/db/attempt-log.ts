// The attempt history (issue 18): the SQL expression every statement that ends an attempt
// sets `attempt_log` to. Its entries hold numbers, times, a backend id, how the attempt ended
// (one of ENDINGS), the provider's status and `retry-after`, and Sarsen's own message for a
// transport failure: never a prompt, an answer body or a credential.

export const ENDINGS = ['succeeded', 'failed', 'retried', 'cancelled', 'lease_lost', 'handed_back', 'worker_died'] as const;
export type Ending = (typeof ENDINGS)[number];

/**
 * `attempt_log` with the running attempt of row `q` appended (unchanged when none runs, as for
 * a pending request cancelled). The arguments are SQL expressions; in an UPDATE's SET list,
 * `q`'s columns are the row before the update.
 */
export function appendAttempt(q: string, e: { ending: string; status?: string; retryAfter?: string; error?: string }): string {
  return `CASE WHEN ${q}.attempt_started_at IS NULL THEN ${q}.attempt_log ELSE ${q}.attempt_log || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
    'attempt', ${q}.attempts, 'started_at', ${q}.attempt_started_at, 'ended_at', now(), 'backend_id', ${q}.backend_id,
    'outcome', ${e.ending}::text, 'status', ${e.status ?? 'NULL'}::int, 'retry_after', ${e.retryAfter ?? 'NULL'}::text,
    'error', ${e.error ?? 'NULL'}::text))) END`;
}
