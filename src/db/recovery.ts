// The recovery sweep's SQL (DESIGN.md "Leases", "Fast death detection").
import type { Pool, PoolClient } from './pool.ts';
import { withTransaction } from './pool.ts';
import { addToRollup, shard } from './counters.ts';
import { enqueueSql } from './jobs.ts';
import { notifyEvents } from './events.ts';

/**
 * Every executor process holds this session-level advisory lock on its bus connection for as
 * long as it lives: a sweep that can take it knows the owner is gone.
 */
export async function holdLivenessLock(client: PoolClient | { query: PoolClient['query'] }, owner: string): Promise<void> {
  await client.query(`SELECT pg_advisory_lock(hashtextextended($1, 0))`, [owner]);
}

export type Recovered = { id: string; attempt: number };

/**
 * Re-dispatches running requests whose lease expired or whose owner is dead: back to pending,
 * `recoveries + 1`, the dead attempt's frames discarded (storage counters follow), a fresh job
 * under the request's job key (which also retires the dead worker's still-locked job), and a
 * `superseded` event for readers. Rows another sweeper holds are skipped, so any number of
 * executors may sweep at once.
 */
export async function recoverDeadAttempts(pool: Pool, self: string, limit = 100): Promise<Recovered[]> {
  return withTransaction(pool, async (c) => {
    const owners = await c.query<{ owner: string }>(
      `SELECT DISTINCT lease_owner AS owner FROM sarsen.requests
        WHERE status = 'running' AND lease_owner IS NOT NULL AND lease_owner <> $1`,
      [self],
    );
    // A transaction-level try-lock: taken only if the owner's session lock is gone, and
    // released with this transaction.
    const dead = await c.query<{ owner: string }>(
      `SELECT owner FROM unnest($1::text[]) AS owner WHERE pg_try_advisory_xact_lock(hashtextextended(owner, 0))`,
      [owners.rows.map((r) => r.owner)],
    );
    const { rows } = await c.query<{ id: string; attempt: number }>(
      `WITH victims AS (
         SELECT id, attempts FROM sarsen.requests
          WHERE status = 'running' AND (lease_expires_at < now() OR lease_owner = ANY($1::text[]))
          ORDER BY lease_expires_at
          LIMIT $2
          FOR UPDATE SKIP LOCKED
       ), discarded AS (
         DELETE FROM sarsen.chunks k USING victims v
          WHERE k.request_id = v.id AND k.attempt = v.attempts
         RETURNING k.request_id, octet_length(k.frame) AS bytes
       ), freed AS (
         SELECT request_id, sum(bytes) AS bytes FROM discarded GROUP BY request_id
       ), requeued AS (
         UPDATE sarsen.requests q
            SET status = 'pending', recoveries = q.recoveries + 1, lease_owner = NULL, lease_expires_at = NULL,
                next_retry_at = NULL, chunk_bytes = q.chunk_bytes - coalesce(f.bytes, 0)
           FROM victims v LEFT JOIN freed f ON f.request_id = v.id
          WHERE q.id = v.id
         RETURNING q.id, q.namespace_id, v.attempts AS attempt, coalesce(f.bytes, 0) AS bytes
       ), unstored AS (
         ${addToRollup(['chunk_bytes'], `SELECT namespace_id, -sum(bytes) AS chunk_bytes FROM requeued GROUP BY namespace_id HAVING sum(bytes) > 0`, '$3')}
         RETURNING 1
       )
       SELECT id, attempt, (SELECT count(*) FROM unstored) AS unstored FROM requeued`,
      [dead.rows.map((r) => r.owner), limit, shard()],
    );
    if (rows.length === 0) return [];
    const ids = rows.map((r) => r.id);
    await c.query(
      `SELECT ${enqueueSql('id')} FROM unnest($1::text[]) AS id`,
      [ids],
    );
    await c.query(`WITH n AS (${notifyEvents(`SELECT id AS request_id, 'superseded' AS event, NULL AS arg FROM unnest($1::text[]) AS id`, '$2')}) SELECT count(*) FROM n`, [
      ids,
      self,
    ]);
    return rows;
  });
}

/**
 * Hands a lease back at once (graceful shutdown of an attempt that cannot finish in time):
 * the same re-dispatch as a recovery, counted as one, without waiting for the lease to expire.
 */
export async function handBack(pool: Pool, id: string, attempt: number, origin: string): Promise<boolean> {
  return withTransaction(pool, async (c) => {
    const { rowCount } = await c.query(
      `WITH discarded AS (
         DELETE FROM sarsen.chunks WHERE request_id = $1 AND attempt = $2
           AND EXISTS (SELECT 1 FROM sarsen.requests WHERE id = $1 AND attempts = $2 AND status = 'running')
         RETURNING octet_length(frame) AS bytes
       ), requeued AS (
         UPDATE sarsen.requests
            SET status = 'pending', recoveries = recoveries + 1, lease_owner = NULL, lease_expires_at = NULL,
                chunk_bytes = chunk_bytes - coalesce((SELECT sum(bytes) FROM discarded), 0)
          WHERE id = $1 AND attempts = $2 AND status = 'running'
         RETURNING namespace_id
       ), unstored AS (
         ${addToRollup(['chunk_bytes'], `SELECT namespace_id, -(SELECT coalesce(sum(bytes), 0) FROM discarded) AS chunk_bytes FROM requeued`, '$3')}
         RETURNING 1
       )
       SELECT (SELECT count(*) FROM unstored) AS n FROM requeued`,
      [id, attempt, shard()],
    );
    if (rowCount !== 1) return false;
    await c.query(
      `SELECT ${enqueueSql('$1::text')}`,
      [id],
    );
    await c.query(`WITH n AS (${notifyEvents(`SELECT $1::text AS request_id, 'superseded' AS event, NULL AS arg`, '$2')}) SELECT count(*) FROM n`, [id, origin]);
    return true;
  });
}

/**
 * Pending requests whose job a worker locked and then died with, before it could claim the
 * request: graphile-worker would only free such a job hours later. A fresh job under the same
 * key replaces it now. (Should the locking worker be alive after all, the claim's fence lets
 * only one of the two runs proceed.)
 */
export async function redispatchStranded(pool: Pool, lockedForMs: number, limit = 100): Promise<string[]> {
  const { rows } = await pool.query<{ id: string }>(
    `SELECT q.id, ${enqueueSql('q.id')}
       FROM sarsen.requests q JOIN graphile_worker.jobs j ON j.key = q.id
      WHERE q.status = 'pending' AND j.locked_at < now() - make_interval(secs => $1::double precision / 1000)
      LIMIT $2`,
    [lockedForMs, limit],
  );
  return rows.map((r) => r.id);
}
