// The recovery sweep's SQL (docs/durability.md "Leases and fencing", "Recovery").
import type { Pool, PoolClient } from './pool.ts';
import type { RequestStatus } from './requests.ts';
import { withTransaction } from './pool.ts';
import { addToRollup } from './counters.ts';
import { enqueueSql, retireJobsSql, staleLockedJobKeysSql, RECOVERY_PRIORITY } from './jobs.ts';
import { notifyEvents } from './events.ts';
import { appendAttempt, type Ending } from './attempt-log.ts';
import { batchInput, oneOfIds, withParts } from './columns.ts';

export type Recovered = { id: string; attempt: number };
/** An attempt to re-dispatch, and how its log entry says it ended. */
type Victim = Recovered & { ending: Extract<Ending, 'lease_lost' | 'handed_back' | 'worker_died'> };

// Executors take their liveness locks again within about a second of the database's return
// (their buses reconnect with at most 1 s between tries); until then a free lock proves nothing.
export const RESTART_GRACE_MS = 3000;

const VICTIMS = batchInput<Victim, { origin: string }>(
  [
    ['id', 'text', (v) => v.id],
    ['attempt', 'int', (v) => v.attempt],
    ['ending', 'text', (v) => v.ending],
  ],
  { origin: 'text' },
);

/**
 * The re-dispatch of attempts whose rows this transaction has locked: back to pending,
 * `recoveries + 1`, the attempt's frames discarded (the storage counters follow; the sequence
 * high-water mark keeps their numbers used), a fresh job under the request's job key (which
 * also retires a dead worker's still-locked job), and a `superseded` event for readers. Run as
 * its own statement after the lock was taken, so its snapshot sees every frame committed
 * before then.
 */
const REQUEUE_SQL = withParts(
  [
    { name: 'victims', sql: `SELECT * FROM ${VICTIMS.unnest('v')}` },
    {
      name: 'discarded',
      sql: `DELETE FROM sarsen.chunks k USING victims v
   WHERE k.request_id = v.id AND ${oneOfIds('k.request_id', VICTIMS.array('id'))} AND k.attempt = v.attempt
  RETURNING k.request_id, k.last_seq, coalesce(k.bytes, octet_length(k.frames)) AS bytes`,
    },
    { name: 'freed', sql: `SELECT request_id, sum(bytes) AS bytes, max(last_seq) AS last_seq FROM discarded GROUP BY request_id` },
    {
      name: 'requeued',
      sql: `UPDATE sarsen.requests q
     SET status = 'pending', recoveries = q.recoveries + 1, lease_owner = NULL, lease_expires_at = NULL,
         next_retry_at = NULL, seq_high = greatest(q.seq_high, coalesce(f.last_seq, 0)),
         attempt_log = ${appendAttempt('q', { ending: 'v.ending' })}, attempt_started_at = NULL
    FROM victims v LEFT JOIN freed f ON f.request_id = v.id
   WHERE q.id = v.id AND ${oneOfIds('q.id', VICTIMS.array('id'))} AND q.attempts = v.attempt AND q.status = 'running'
  RETURNING q.id, q.namespace_id, v.attempt, coalesce(f.bytes, 0) AS bytes`,
    },
    {
      name: 'unstored',
      sql: `${addToRollup(['chunk_bytes'], `SELECT namespace_id, -sum(bytes) AS chunk_bytes FROM requeued GROUP BY namespace_id HAVING sum(bytes) > 0`)}
  RETURNING 1`,
    },
    { name: 'queued', sql: `SELECT ${enqueueSql('id', undefined, RECOVERY_PRIORITY)} FROM requeued` },
    { name: 'notified', sql: notifyEvents(`SELECT id AS request_id, 'superseded' AS event, NULL AS arg FROM requeued`, VICTIMS.param('origin')) },
  ],
  `SELECT id, attempt, (SELECT count(*) FROM unstored) + (SELECT count(*) FROM queued) + (SELECT count(*) FROM notified) AS side_effects
  FROM requeued`,
);

/** The statements' text by name (test/sql-snapshots holds a copy of each). */
export const RECOVERY_SQL: Readonly<Record<string, string>> = { recovery_requeue: REQUEUE_SQL };

async function requeue(c: PoolClient, victims: readonly Victim[], origin: string): Promise<Recovered[]> {
  if (victims.length === 0) return [];
  await c.query(retireJobsSql('$1::text[]'), [victims.map((v) => v.id)]);
  const { rows } = await c.query<Recovered>(REQUEUE_SQL, VICTIMS.values(victims, { origin }));
  return rows;
}

/**
 * The sweep's lookups, run in an `indexed` transaction every `sweep_interval_ms`: each reaches
 * the requests through the lease index or by key, so it costs what the live work costs however
 * many requests the table holds (test/integration/watch-plan.test.ts).
 */
export const SWEEP_LOOKUP_SQL = {
  /** Whose leases are out ($1: this process). */
  owners: `SELECT DISTINCT lease_owner AS owner FROM sarsen.requests
        WHERE status = 'running' AND lease_expires_at IS NOT NULL AND lease_owner IS NOT NULL AND lease_owner <> $1`,
  /** The attempts of dead owners ($1) and the expired leases, oldest first, at most $2. */
  victims: `SELECT id, attempts AS attempt, CASE WHEN lease_owner = ANY($1::text[]) THEN 'worker_died' ELSE 'lease_lost' END AS ending
         FROM sarsen.requests
        WHERE status = 'running' AND lease_expires_at IS NOT NULL AND (lease_expires_at < now() OR lease_owner = ANY($1::text[]))
        ORDER BY lease_expires_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED`,
  /** Requests not running whose job has been locked longer than $1 ms, at most $2: from the jobs (live work only), each request by key. */
  stranded: `WITH held AS MATERIALIZED (${staleLockedJobKeysSql('$1::double precision')})
        SELECT q.id, q.status FROM held h JOIN sarsen.requests q ON q.id = h.key
         WHERE q.status <> 'running'
         LIMIT $2
         FOR UPDATE OF q SKIP LOCKED`,
} as const;

/**
 * Re-dispatches running requests whose lease expired or whose owner is dead (see REQUEUE).
 * Rows another sweeper holds, or a chunk writer is storing frames for, are skipped this round,
 * so any number of executors may sweep at once.
 */
export async function recoverDeadAttempts(pool: Pool, self: string, limit = 100, settling = false): Promise<Recovered[]> {
  return withTransaction(pool, async (c) => {
    const owners = await c.query<{ owner: string }>(SWEEP_LOOKUP_SQL.owners, [self]);
    // A transaction-level try-lock: taken only if the owner's session lock is gone, and
    // released with this transaction. Right after the server (re)started or failed over
    // (`settling`) every lock is gone, the live owners' too, until their buses reconnect: then
    // only expired leases count.
    const dead = await c.query<{ owner: string }>(
      `SELECT owner FROM unnest($1::text[]) AS owner
        WHERE NOT $3::boolean AND pg_postmaster_start_time() < now() - make_interval(secs => $2::double precision / 1000)
          AND pg_try_advisory_xact_lock(hashtextextended(owner, 0))`,
      [owners.rows.map((r) => r.owner), RESTART_GRACE_MS, settling],
    );
    // A dead owner's attempt ended with its worker; a live owner's whose lease ran out lost it.
    const victims = await c.query<Victim>(SWEEP_LOOKUP_SQL.victims, [dead.rows.map((r) => r.owner), limit]);
    return requeue(c, victims.rows, self);
  }, { indexed: true });
}

/**
 * Re-dispatches the running attempts of `owners`, executors found dead (the caller's transaction
 * holds their liveness locks). Rows locked elsewhere this instant are skipped: the caller keeps
 * such an owner listed and tries again.
 */
export async function requeueOwnedBy(c: PoolClient, owners: readonly string[], origin: string): Promise<Recovered[]> {
  const victims = await c.query<Victim>(
    `SELECT id, attempts AS attempt, 'worker_died' AS ending FROM sarsen.requests
      WHERE lease_expires_at IS NOT NULL AND status = 'running' AND lease_owner = ANY($1::text[])
      FOR UPDATE SKIP LOCKED`,
    [owners],
  );
  return requeue(c, victims.rows, origin);
}

/**
 * Hands a lease back at once (graceful shutdown of an attempt that cannot finish in time):
 * the same re-dispatch as a recovery, counted as one, without waiting for the lease to expire.
 */
export async function handBack(pool: Pool, id: string, attempt: number, origin: string): Promise<boolean> {
  return withTransaction(pool, async (c) => {
    const held = await c.query<Victim>(
      `SELECT id, attempts AS attempt, 'handed_back' AS ending FROM sarsen.requests WHERE id = $1 AND attempts = $2 AND status = 'running' FOR UPDATE`,
      [id, attempt],
    );
    return (await requeue(c, held.rows, origin)).length === 1;
  });
}

/**
 * Jobs a worker locked and then lost (it died, or its fetch's answer was lost to an outage),
 * found once they have been locked longer than a lease: graphile-worker would free them only
 * hours later. A pending request's job is replaced by a fresh one under the same key; an ended
 * request's job is deleted (the request was run by another job). Should the locking worker be
 * alive after all, the claim's fence lets only one run proceed, and its completion finds no
 * row to delete.
 */
export async function redispatchStranded(pool: Pool, lockedForMs: number, limit = 100): Promise<string[]> {
  return withTransaction(pool, async (c) => {
    const { rows } = await c.query<{ id: string; status: RequestStatus }>(SWEEP_LOOKUP_SQL.stranded, [lockedForMs, limit]);
    if (rows.length === 0) return [];
    await c.query(retireJobsSql('$1::text[]'), [rows.map((r) => r.id)]);
    const pending = rows.filter((r) => r.status === 'pending').map((r) => r.id);
    if (pending.length > 0) await c.query(`SELECT ${enqueueSql('id')} FROM unnest($1::text[]) AS id`, [pending]);
    return pending;
  }, { indexed: true });
}
