// Sign-in attempts counted per key (core/sign-in-throttle.ts says whose): all of their SQL.
import type { Pool } from './pool.ts';

const WINDOW = `make_interval(secs => $2::double precision / 1000)`;
// Ended windows removed per counted attempt: more than an attempt adds, so the table stays
// bounded by the attempts of one window.
const SWEEP = 16;

export type Counted = { attempts: number; retryAfterSeconds: number };

/**
 * Counts one attempt against each key, opening a fresh window for a key whose window has
 * ended, and answers per key (in order) the attempts in its window and the seconds left of
 * it. Keys are locked in the order given, by every caller, so concurrent attempts queue
 * rather than deadlock; the sweep skips rows others hold.
 */
export async function countAttempt(pool: Pool, keys: readonly Buffer[], windowMs: number): Promise<Counted[]> {
  const { rows } = await pool.query<{ key: Buffer; attempts: number; retry_after: number }>(
    `WITH swept AS (
       DELETE FROM sarsen.sign_in_attempts WHERE key IN (
         SELECT key FROM sarsen.sign_in_attempts
          WHERE window_start <= now() - ${WINDOW} AND key <> ALL($1::bytea[])
          ORDER BY window_start LIMIT ${SWEEP} FOR UPDATE SKIP LOCKED)
     ), counted AS (
       INSERT INTO sarsen.sign_in_attempts AS a (key, attempts, window_start)
       SELECT k, 1, now() FROM unnest($1::bytea[]) WITH ORDINALITY AS u(k, ord) ORDER BY ord
       ON CONFLICT (key) DO UPDATE SET
         attempts = CASE WHEN a.window_start <= now() - ${WINDOW} THEN 1 ELSE a.attempts + 1 END,
         window_start = CASE WHEN a.window_start <= now() - ${WINDOW} THEN now() ELSE a.window_start END
       RETURNING a.key, a.attempts, a.window_start
     )
     SELECT key, attempts, greatest(1, ceil(extract(epoch FROM window_start + ${WINDOW} - now())))::int AS retry_after
       FROM counted`,
    [keys, windowMs],
  );
  const byKey = new Map(rows.map((r) => [r.key.toString('hex'), r]));
  return keys.map((k) => {
    const r = byKey.get(k.toString('hex'))!;
    return { attempts: r.attempts, retryAfterSeconds: r.retry_after };
  });
}

/** A successful sign-in: its account's count starts over, and its own attempt is taken back from its address's. */
export async function attemptSucceeded(pool: Pool, account: Buffer, address: Buffer): Promise<void> {
  await pool.query(
    `WITH cleared AS (DELETE FROM sarsen.sign_in_attempts WHERE key = $1)
     UPDATE sarsen.sign_in_attempts SET attempts = greatest(attempts - 1, 0) WHERE key = $2`,
    [account, address],
  );
}
