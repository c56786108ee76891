// The retention sweep's SQL (SPEC.md "Retention rules", "Swept record"). Each statement is one
// bounded batch, index-driven, skipping rows other sweepers hold, so no long lock is taken.
import type { Pool } from './pool.ts';
import { addToRollup, shard } from './counters.ts';

export type NamespaceHorizon = { namespace_id: string; namespace_minutes: number | null; tenancy_minutes: number | null };

export async function namespaceHorizons(pool: Pool): Promise<NamespaceHorizon[]> {
  const { rows } = await pool.query<NamespaceHorizon>(
    `SELECT n.id AS namespace_id, n.retention_minutes AS namespace_minutes, t.retention_minutes AS tenancy_minutes
       FROM sarsen.namespaces n JOIN sarsen.tenancies t ON t.id = n.tenancy_id`,
  );
  return rows;
}

const SWEEP = (scope: string) => `
WITH victims AS (
  SELECT id, namespace_id, request_bytes, response_bytes, chunk_bytes FROM sarsen.requests
   WHERE ${scope} AND NOT expired AND status IN ('succeeded', 'failed')
     AND finished_at < now() - make_interval(mins => $2::int)
   ORDER BY finished_at
   LIMIT $3
   FOR UPDATE SKIP LOCKED
), bodies AS (
  DELETE FROM sarsen.request_bodies WHERE request_id IN (SELECT id FROM victims) RETURNING 1
), answers AS (
  DELETE FROM sarsen.responses WHERE request_id IN (SELECT id FROM victims) RETURNING 1
), frames AS (
  DELETE FROM sarsen.chunks WHERE request_id IN (SELECT id FROM victims) RETURNING 1
), claims AS (
  -- A swept answer cannot be attached to: the same body afterwards is a new request.
  DELETE FROM sarsen.idempotency_claims WHERE request_id IN (SELECT id FROM victims) RETURNING 1
), marked AS (
  UPDATE sarsen.requests q SET expired = true, attempt_log = '[]', request_bytes = 0, response_bytes = 0, chunk_bytes = 0
    FROM victims v WHERE q.id = v.id
  RETURNING v.namespace_id, v.request_bytes, v.response_bytes, v.chunk_bytes
), unstored AS (
  ${addToRollup(
    ['request_bytes', 'response_bytes', 'chunk_bytes'],
    `SELECT namespace_id, -sum(request_bytes) AS request_bytes, -sum(response_bytes) AS response_bytes, -sum(chunk_bytes) AS chunk_bytes
       FROM marked GROUP BY namespace_id`,
    '$4',
  )}
  RETURNING 1
)
SELECT (SELECT count(*) FROM marked)::int AS swept,
       (SELECT count(*) FROM bodies) + (SELECT count(*) FROM answers) + (SELECT count(*) FROM frames)
         + (SELECT count(*) FROM claims) + (SELECT count(*) FROM unstored) AS removed`;

const SWEEP_NAMESPACE = SWEEP('namespace_id = $1');
// Records whose namespace was deleted keep only the deployment's metadata horizon.
const SWEEP_ORPHANS = SWEEP('$1::text IS NULL AND NOT EXISTS (SELECT 1 FROM sarsen.namespaces n WHERE n.id = namespace_id)');

/**
 * Removes the body, answer and frames of up to `limit` finished records older than `minutes`
 * (the namespace's effective retention), keeps their metadata, marks them expired and takes
 * their bytes off the storage counters, all in one statement. Answers how many were swept.
 */
export async function sweepRecords(pool: Pool, namespaceId: string | null, minutes: number, limit: number): Promise<number> {
  const { rows } = await pool.query<{ swept: number }>(namespaceId === null ? SWEEP_ORPHANS : SWEEP_NAMESPACE, [
    namespaceId, minutes, limit, shard(),
  ]);
  return rows[0]!.swept;
}

/** Lapsed idempotency claims go whatever retention says (SPEC.md Retention rule 6). */
export async function sweepLapsedClaims(pool: Pool, limit: number): Promise<number> {
  const { rowCount } = await pool.query(
    `DELETE FROM sarsen.idempotency_claims WHERE ctid IN (
       SELECT ctid FROM sarsen.idempotency_claims WHERE expires_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED)`,
    [limit],
  );
  return rowCount ?? 0;
}

/** Listing metadata past its own horizon: the request row goes entirely. */
export async function sweepListingRows(pool: Pool, days: number, limit: number): Promise<number> {
  const { rowCount } = await pool.query(
    `DELETE FROM sarsen.requests WHERE id IN (
       SELECT id FROM sarsen.requests
        WHERE expired AND status IN ('succeeded', 'failed') AND finished_at < now() - make_interval(days => $1::int)
        ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED)`,
    [days, limit],
  );
  return rowCount ?? 0;
}

/** Ledger rows (and the hourly usage built from them) past the ledger horizon. */
export async function sweepLedger(pool: Pool, days: number, limit: number): Promise<number> {
  const ledger = await pool.query(
    `DELETE FROM sarsen.ledger WHERE id IN (
       SELECT id FROM sarsen.ledger WHERE created_at < now() - make_interval(days => $1::int) ORDER BY created_at LIMIT $2)`,
    [days, limit],
  );
  const hourly = await pool.query(
    `DELETE FROM sarsen.key_usage_hourly WHERE ctid IN (
       SELECT ctid FROM sarsen.key_usage_hourly WHERE hour < now() - make_interval(days => $1::int) LIMIT $2)`,
    [days, limit],
  );
  return (ledger.rowCount ?? 0) + (hourly.rowCount ?? 0);
}
