// Sign-in attempts counted per key (core/sign-in-throttle.ts says whose): all of their SQL.
import { withTransaction, type Pool } from './pool.ts';

const WINDOW = `make_interval(secs => $2::double precision / 1000)`;
// Ended windows removed per counted attempt: more than an attempt adds, so the table stays
// bounded by the attempts of one window.
const SWEEP = 16;

export type Counted = { attempts: number; retryAfterSeconds: number };

export type Counts = { pair: Counted; account: Counted; address: Counted };

/**
 * Counts one attempt against its pair and its address, and asks `wait` (given the account's
 * count as if this attempt were on it too) how long the caller must wait; only an attempt that
 * need not wait is counted on the account, so refused attempts never raise its ceiling. One
 * transaction, holding the account's row from the count to the decision, so concurrent
 * attempts cannot pass the ceiling together. Keys are locked pair, account, address by every
 * caller, so concurrent attempts queue rather than deadlock; the sweep skips rows others hold.
 */
export async function countAttempt(
  pool: Pool,
  keys: Readonly<{ pair: Buffer; account: Buffer; address: Buffer }>,
  windowMs: number,
  wait: (c: Counts) => number,
): Promise<number> {
  const order = [keys.pair, keys.account, keys.address];
  return withTransaction(pool, async (client) => {
    const { rows } = await client.query<{ key: Buffer; attempts: number; retry_after: number }>(
      `WITH swept AS (
         DELETE FROM sarsen.sign_in_attempts WHERE key IN (
           SELECT key FROM sarsen.sign_in_attempts
            WHERE window_start <= now() - ${WINDOW} AND key <> ALL($1::bytea[])
            ORDER BY window_start LIMIT ${SWEEP} FOR UPDATE SKIP LOCKED)
       ), counted AS (
         INSERT INTO sarsen.sign_in_attempts AS a (key, attempts, window_start)
         SELECT k, n, now() FROM unnest($1::bytea[], $3::int[]) WITH ORDINALITY AS u(k, n, ord) ORDER BY ord
         ON CONFLICT (key) DO UPDATE SET
           attempts = CASE WHEN a.window_start <= now() - ${WINDOW} THEN excluded.attempts ELSE a.attempts + excluded.attempts END,
           window_start = CASE WHEN a.window_start <= now() - ${WINDOW} THEN now() ELSE a.window_start END
         RETURNING a.key, a.attempts, a.window_start
       )
       SELECT key, attempts, greatest(1, ceil(extract(epoch FROM window_start + ${WINDOW} - now())))::int AS retry_after
         FROM counted`,
      // The account's row is only locked (and its window opened or renewed) here: +0.
      [order, windowMs, [1, 0, 1]],
    );
    const byKey = new Map(rows.map((r) => [r.key.toString('hex'), { attempts: r.attempts, retryAfterSeconds: r.retry_after }]));
    const [pair, account, address] = order.map((k) => byKey.get(k.toString('hex'))!) as [Counted, Counted, Counted];
    const seconds = wait({ pair, account: { ...account, attempts: account.attempts + 1 }, address });
    if (seconds === 0) await client.query(`UPDATE sarsen.sign_in_attempts SET attempts = attempts + 1 WHERE key = $1`, [keys.account]);
    return seconds;
  });
}

/**
 * A successful sign-in: the count of `clear` (its account and address together) starts over,
 * and its own attempt is taken back from each of `takeBack` (its account's and its address's,
 * which keep the other attempts they counted).
 */
export async function attemptSucceeded(pool: Pool, clear: Buffer, takeBack: readonly Buffer[]): Promise<void> {
  await pool.query(
    `WITH cleared AS (DELETE FROM sarsen.sign_in_attempts WHERE key = $1)
     UPDATE sarsen.sign_in_attempts SET attempts = greatest(attempts - 1, 0) WHERE key = ANY($2::bytea[])`,
    [clear, takeBack],
  );
}
