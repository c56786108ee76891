// Which executor processes are alive, and the one of them that watches the others
// (docs/durability.md "Recovery"). Each executor holds a session-level advisory lock named by
// its id on its bus connection for as long as it lives, and is listed in `sarsen.executors`
// with the graphile-worker pools it runs. One executor, the one holding the watch lock (also on
// its bus connection), looks for listed executors whose lock it can take (a few times a second
// while work runs, every few seconds while the deployment is idle: src/executor/sweep.ts):
// those died, and their attempts are re-dispatched and their pools' jobs freed at once, without
// waiting for a sweep.
import type pg from 'pg';
import type { Pool } from './pool.ts';
import { withTransaction } from './pool.ts';
import { requeueOwnedBy, RESTART_GRACE_MS, type Recovered } from './recovery.ts';
import { wakeWorkersSql } from './jobs.ts';

type Session = Pick<pg.Client, 'query'> & { once?(event: 'end', fn: () => void): unknown; processID?: number | null };

// How long a new bus session waits for the one it replaces to end (see onConnect).
const REPLACED_EXIT_MS = 1000;

// An arbitrary, fixed 64-bit key: "sarsen liveness watch".
const WATCH_LOCK_KEY = (0x5a7e_3100_0004n).toString();

const AFTER_RESTART_GRACE = `pg_postmaster_start_time() < now() - make_interval(secs => ${RESTART_GRACE_MS}::double precision / 1000)`;

/** SQL taking the liveness lock named by `owner` (an SQL expression) for the current transaction, if it is free. */
const tryLivenessLockSql = (owner: string): string => `pg_try_advisory_xact_lock(hashtextextended(${owner}, 0))`;

export type Liveness = {
  readonly owner: string;
  /** The bus's connect hook: holds the liveness lock on the bus's session, then lists the process. */
  onConnect(session: Session): Promise<void>;
  /** Lists a graphile-worker pool of this process: if the process dies, the jobs it locked are freed. */
  addJobPool(pool: Pool, poolId: string): Promise<void>;
  /** Unlists a pool that stopped and whose jobs were freed, so that the list does not grow with every replacement. */
  dropJobPool(pool: Pool, poolId: string): Promise<void>;
  /** Whether this process watches the others: it takes the watch lock on its bus session when that is free. */
  watching(): Promise<boolean>;
  /** Whether this process held the watch lock when it last asked (no round trip). */
  watches(): boolean;
  /**
   * True for a grace after this process's bus connected again: the database restarted or failed
   * over, every lock went with it, and the live executors' buses are still coming back.
   */
  settling(): boolean;
  /** Unlists the process as it stops, having handed back its work (else the watcher would take it for dead). */
  leave(pool: Pool): Promise<void>;
};

export function createLiveness(owner: string): Liveness {
  const jobPools: string[] = [];
  // The bus's current session, and whether this process holds the watch lock on it.
  let current: { session: Session; watching: boolean } | null = null;
  // The server processes of this process's bus sessions that may still hold the lock.
  const earlier = new Set<number>();
  let connectedBefore = false;
  let settlingUntil = 0;
  return {
    owner,
    async onConnect(session) {
      // A promoted standby keeps its postmaster's start time, so a failover is told by the
      // reconnect itself, not by pg_postmaster_start_time().
      if (connectedBefore) settlingUntil = performance.now() + RESTART_GRACE_MS;
      connectedBefore = true;
      // A session this process gave up on (its link went silent: docs/operations.md "When the
      // network goes silent") can live on at the server, holding the lock, for as long as the
      // server believes its peer is there: it is ended first, or the lock below would wait for
      // it. (By pid and this process's own connection name: a pid on another server, after a
      // failover, is someone else's.)
      if (earlier.size > 0) {
        await session.query(
          `SELECT pg_terminate_backend(pid, ${REPLACED_EXIT_MS}) FROM pg_stat_activity
            WHERE pid = ANY($1::int[]) AND pid <> pg_backend_pid() AND application_name = current_setting('application_name')`,
          [[...earlier]],
        );
      }
      const pid = session.processID;
      if (pid) earlier.add(pid);
      // Locked first, then listed: a listed executor whose lock is free is dead.
      await session.query(`SELECT pg_advisory_lock(hashtextextended($1, 0))`, [owner]);
      earlier.clear();
      if (pid) earlier.add(pid);
      await session.query(
        `INSERT INTO sarsen.executors (process_id, job_pools) VALUES ($1, $2::text[])
         ON CONFLICT (process_id) DO UPDATE SET job_pools = EXCLUDED.job_pools`,
        [owner, jobPools],
      );
      const s = { session, watching: false };
      current = s;
      session.once?.('end', () => {
        if (current === s) current = null;
      });
    },
    async addJobPool(pool, poolId) {
      jobPools.push(poolId);
      await pool.query(`UPDATE sarsen.executors SET job_pools = array_append(job_pools, $2) WHERE process_id = $1`, [owner, poolId]);
    },
    async dropJobPool(pool, poolId) {
      const at = jobPools.indexOf(poolId);
      if (at >= 0) jobPools.splice(at, 1);
      await pool.query(`UPDATE sarsen.executors SET job_pools = array_remove(job_pools, $2) WHERE process_id = $1`, [owner, poolId]);
    },
    async watching() {
      const s = current;
      if (!s) return false;
      if (!s.watching) {
        const { rows } = await s.session.query<{ ok: boolean }>(`SELECT pg_try_advisory_lock($1) AS ok`, [WATCH_LOCK_KEY]);
        s.watching = rows[0]!.ok;
      }
      return s.watching;
    },
    watches: () => current?.watching === true,
    settling: () => performance.now() < settlingUntil,
    async leave(pool) {
      await pool.query(`DELETE FROM sarsen.executors WHERE process_id = $1`, [owner]);
    },
  };
}

/**
 * The watch's look, one statement: the listed executors other than `self` whose liveness lock is
 * free (dead), and whether any lease has expired. Right after the database (re)started or failed
 * over every lock is free, the live executors' too, until their buses reconnect: then, and while
 * `settling`, nobody counts as dead. ($1: this process; $2: settling.)
 */
export const WATCH_SQL = `SELECT ARRAY(SELECT e.process_id FROM sarsen.executors e
                   WHERE e.process_id <> $1 AND NOT $2::boolean AND ${AFTER_RESTART_GRACE} AND ${tryLivenessLockSql('e.process_id')}) AS dead,
            -- The earliest lease, read off the end of the lease index whatever the table's
            -- statistics say: an EXISTS with no statistics yet (a new partition, or autovacuum
            -- off) scanned the whole table, four times a second, growing with it.
            coalesce((SELECT min(lease_expires_at) FROM sarsen.requests) < now(), false) AS expired`;

/** Runs the watch's look (WATCH_SQL). */
export async function watchExecutors(pool: Pool, self: string, settling: boolean): Promise<{ dead: string[]; expired: boolean }> {
  const { rows } = await pool.query<{ dead: string[]; expired: boolean }>(WATCH_SQL, [self, settling]);
  return rows[0]!;
}

/**
 * Settles what dead executors left: their running attempts re-dispatched (see requeueOwnedBy),
 * the jobs their pools had locked freed (a pending request's, to run now) or deleted (any other),
 * and their listing removed. Their locks are held while this runs, so a live process whose bus
 * only reconnects cannot list itself again until it has; its attempts' fences then stop them.
 */
export async function recoverExecutors(pool: Pool, self: string, candidates: readonly string[]): Promise<{ dead: string[]; recovered: Recovered[]; jobs: { freed: number; deleted: number } }> {
  return withTransaction(pool, async (c) => {
    const { rows } = await c.query<{ process_id: string; job_pools: string[] }>(
      `SELECT process_id, job_pools FROM sarsen.executors
        WHERE process_id = ANY($1::text[]) AND process_id <> $2 AND ${tryLivenessLockSql('process_id')}
        FOR UPDATE`,
      [candidates, self],
    );
    const dead = rows.map((r) => r.process_id);
    if (dead.length === 0) return { dead, recovered: [], jobs: { freed: 0, deleted: 0 } };
    const recovered = await requeueOwnedBy(c, dead, self);
    const jobs = await c.query<{ freed: number; deleted: number }>(
      `WITH held AS (
         SELECT j.id, q.status FROM graphile_worker._private_jobs j LEFT JOIN sarsen.requests q ON q.id = j.key
          WHERE j.locked_by = ANY($1::text[])
       ), freed AS (
         UPDATE graphile_worker._private_jobs j SET locked_at = NULL, locked_by = NULL
           FROM held h WHERE j.id = h.id AND h.status = 'pending' RETURNING 1
       ), deleted AS (
         DELETE FROM graphile_worker._private_jobs j USING held h
          WHERE j.id = h.id AND h.status IS DISTINCT FROM 'pending' RETURNING 1
       )
       SELECT (SELECT count(*) FROM freed)::int AS freed, (SELECT count(*) FROM deleted)::int AS deleted`,
      [rows.flatMap((r) => r.job_pools)],
    );
    const { freed, deleted } = jobs.rows[0]!;
    if (freed > 0) await c.query(wakeWorkersSql('$1::int'), [freed]);
    // Listed until nothing of theirs runs (a row locked elsewhere was skipped: the next look retries it).
    await c.query(
      `DELETE FROM sarsen.executors e WHERE e.process_id = ANY($1::text[])
          AND NOT EXISTS (SELECT 1 FROM sarsen.requests q
                           WHERE q.lease_expires_at IS NOT NULL AND q.status = 'running' AND q.lease_owner = e.process_id)`,
      [dead],
    );
    return { dead, recovered, jobs: { freed, deleted } };
  });
}
