// The retention sweep's SQL (docs/accounting.md "Retention", "Swept records"). Each statement is
// one bounded batch, index-driven, skipping rows other sweepers hold, so no long lock is taken.
import type { Pool } from './pool.ts';
import { addToRollup } from './counters.ts';

type Db = Pick<Pool, 'query'>;

// 0x5a7e_3100_0029: a session advisory lock held by the executor running a retention pass, so
// one executor at a time runs one.
const PASS_LOCK = 99498034462761;

/**
 * Takes the pass lock on `db`'s session: `wait` waits for a pass another process runs to end;
 * otherwise answers false at once when one is running.
 */
export async function lockRetentionPass(db: Db, wait: boolean): Promise<boolean> {
  if (!wait) return (await db.query<{ ok: boolean }>('SELECT pg_try_advisory_lock($1) AS ok', [PASS_LOCK])).rows[0]!.ok;
  await db.query('SELECT pg_advisory_lock($1)', [PASS_LOCK]);
  return true;
}

/** Releases the pass lock taken on `db`'s session. */
export async function unlockRetentionPass(db: Db): Promise<void> {
  await db.query('SELECT pg_advisory_unlock($1)', [PASS_LOCK]);
}

export type NamespaceHorizon = { namespace_id: string; namespace_minutes: number | null; tenancy_minutes: number | null };

export async function namespaceHorizons(pool: Db): Promise<NamespaceHorizon[]> {
  const { rows } = await pool.query<NamespaceHorizon>(
    `SELECT n.id AS namespace_id, n.retention_minutes AS namespace_minutes, t.retention_minutes AS tenancy_minutes
       FROM sarsen.namespaces n JOIN sarsen.tenancies t ON t.id = n.tenancy_id`,
  );
  return rows;
}

/**
 * One statement that removes the body, answer, frames and claim of the finished records
 * `victims` selects (id, namespace_id and the three byte counts, locked), keeps their metadata,
 * marks them expired and takes their bytes off the storage counters.
 */
const sweepOf = (victims: string) => `
WITH victims AS (${victims}
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
  )}
  RETURNING 1
)
SELECT (SELECT count(*) FROM marked)::int AS swept,
       (SELECT count(*) FROM bodies) + (SELECT count(*) FROM answers) + (SELECT count(*) FROM frames)
         + (SELECT count(*) FROM claims) + (SELECT count(*) FROM unstored) AS removed`;

const SWEEP = (scope: string) => sweepOf(`
  SELECT id, namespace_id, request_bytes, response_bytes, chunk_bytes FROM sarsen.requests
   WHERE ${scope} AND NOT expired AND status IN ('succeeded', 'failed')
     AND finished_at < now() - make_interval(mins => $2::int)
     -- Only ids from $5 (below it, payloads went with their partitions) up to $6 (null: no
     -- bound). Ids sort by creation, which a finish cannot precede: the index range starts at
     -- $4, past the rows whose payloads were dropped.
     AND finished_at >= $4::timestamptz AND id >= $5 AND ($6::text IS NULL OR id < $6)
   ORDER BY finished_at
   LIMIT $3
   FOR UPDATE SKIP LOCKED`);

const SWEEP_NAMESPACE = SWEEP('namespace_id = $1');
// Records whose namespace was deleted keep only the deployment's metadata horizon.
const SWEEP_ORPHANS = SWEEP('$1::text IS NULL AND NOT EXISTS (SELECT 1 FROM sarsen.namespaces n WHERE n.id = namespace_id)');

/** The request ids a row sweep may touch: from `from` (the retired mark), below `below` (null: no bound). */
export type IdRange = { from: string; fromMs: number | null; below: string | null };

// How far a request's id (its process's clock) may run ahead of the database's clock.
const CLOCK_SLACK_MS = 5 * 60_000;

/**
 * Removes the body, answer and frames of up to `limit` finished records older than `minutes`
 * (the namespace's effective retention) in `ids`, keeps their metadata, marks them expired and
 * takes their bytes off the storage counters, all in one statement. Answers how many were swept.
 */
export async function sweepRecords(db: Db, namespaceId: string | null, minutes: number, limit: number, ids: IdRange): Promise<number> {
  const finishedFrom = ids.fromMs === null ? '-infinity' : new Date(ids.fromMs - CLOCK_SLACK_MS).toISOString();
  const { rows } = await db.query<{ swept: number }>(namespaceId === null ? SWEEP_ORPHANS : SWEEP_NAMESPACE, [
    namespaceId, minutes, limit, finishedFrom, ids.from, ids.below,
  ]);
  return rows[0]!.swept;
}

// One finished record of a namespace, whatever its age (DELETE .../responses/{id}).
const SWEEP_ONE = sweepOf(`
  SELECT id, namespace_id, request_bytes, response_bytes, chunk_bytes FROM sarsen.requests
   WHERE id = $1 AND namespace_id = $2 AND NOT expired AND status IN ('succeeded', 'failed')
   FOR UPDATE`);

/** Sweeps one finished record of this namespace now, as the sweep would; false when there was nothing to sweep. */
export async function sweepRecord(db: Db, namespaceId: string, requestId: string): Promise<boolean> {
  const { rows } = await db.query<{ swept: number }>(SWEEP_ONE, [requestId, namespaceId]);
  return rows[0]!.swept === 1;
}

/**
 * Lapsed idempotency claims go whatever retention says (docs/accounting.md "Lapsed claims and
 * longer horizons").
 */
export async function sweepLapsedClaims(pool: Db, limit: number): Promise<number> {
  const { rowCount } = await pool.query(
    `DELETE FROM sarsen.idempotency_claims WHERE ctid IN (
       SELECT ctid FROM sarsen.idempotency_claims WHERE expires_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED)`,
    [limit],
  );
  return rowCount ?? 0;
}

/** Listing metadata past its own horizon: the request row goes entirely, and its provider response ids with it. */
export async function sweepListingRows(pool: Db, days: number, limit: number): Promise<number> {
  const { rows } = await pool.query<{ deleted: number }>(
    `WITH gone AS (
       DELETE FROM sarsen.requests WHERE id IN (
         SELECT id FROM sarsen.requests
          WHERE expired AND status IN ('succeeded', 'failed') AND finished_at < now() - make_interval(days => $1::int)
          ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED)
       RETURNING id
     ), ids AS (
       DELETE FROM sarsen.provider_response_ids WHERE request_id IN (SELECT id FROM gone)
     )
     SELECT count(*)::int AS deleted FROM gone`,
    [days, limit],
  );
  return rows[0]!.deleted;
}

/**
 * Ledger rows (and the hourly usage built from them) past the ledger horizon. Rows are deleted
 * only in `legacy`, the partition the migration attached (its name as listPartitions gives it;
 * null: none is left), through its own index by creation time (migration 026): the monthly
 * partitions go whole (src/db/partitions.ts).
 */
export async function sweepLedger(pool: Db, days: number, limit: number, legacy: string | null): Promise<number> {
  const ledger = legacy === null ? { rowCount: 0 } : await pool.query(
    `DELETE FROM sarsen.${legacy} WHERE ctid IN (
       SELECT ctid FROM sarsen.${legacy} WHERE created_at < now() - make_interval(days => $1::int) ORDER BY created_at LIMIT $2)`,
    [days, limit],
  );
  const hourly = await pool.query(
    `DELETE FROM sarsen.key_usage_hourly WHERE ctid IN (
       SELECT ctid FROM sarsen.key_usage_hourly WHERE hour < now() - make_interval(days => $1::int) LIMIT $2)`,
    [days, limit],
  );
  return (ledger.rowCount ?? 0) + (hourly.rowCount ?? 0);
}
