// Rate limits per key (docs/api.md "Rate limits"): each limited key has one window row, the
// current minute of the database's clock. Acceptance counts requests inside the submission's own
// group commit (the parts below join that statement): the window row is locked by the upsert,
// so every process and lane counts against the same figure, and a submission over the limit is
// refused without writing anything else. Terminal writes charge tokens to a row of their own,
// which submissions read unlocked: a settling answer never waits on a submission's commit, nor
// a submission on a settle's. A batch with no limited key uses a statement without these parts.
import type { Pool } from './pool.ts';
import type { Part } from './columns.ts';

/** A key's limits; null fields: that limit is off. */
export type KeyLimits = Readonly<{ requestsPerMinute: number | null; tokensPerMinute: number | null }>;

/** A submission over its key's limit: nothing was written. */
export type Refused = Readonly<{ refused: 'requests' | 'tokens'; retryAfterSeconds: number }>;

/** A submission refused by its key's rate limit; the caller maps it to its 429. */
export class RateLimitRefusal extends Error {
  override name = 'RateLimitRefusal';
  readonly limit: 'requests' | 'tokens';
  readonly retryAfterSeconds: number;
  constructor(r: Refused) {
    super(
      r.refused === 'requests'
        ? `The API key's limit of requests per minute is reached; retry after ${r.retryAfterSeconds} s.`
        : `The API key's limit of tokens per minute is reached; retry after ${r.retryAfterSeconds} s.`,
    );
    this.limit = r.refused;
    this.retryAfterSeconds = r.retryAfterSeconds;
  }
}

const MINUTE = `date_trunc('minute', now())`;
// Statements that began in an earlier minute than the row's latest writer count in the newer
// window (the row's start never moves back); a newer minute resets the figures.
const SAME = `w.window_start >= EXCLUDED.window_start`;
const current = (column: string) => `CASE WHEN ${SAME} THEN w.${column} ELSE 0 END`;
const MOVE_ON = `window_start = greatest(w.window_start, EXCLUDED.window_start)`;

// The upsert proposes the row a fresh window would get (all admitted up to the request limit),
// so EXCLUDED carries what was asked (admitted plus refused) and the limits.
const ASKED = `(EXCLUDED.requests + EXCLUDED.refused)`;
const ADMITTED = `CASE WHEN EXCLUDED.token_limit IS NOT NULL AND EXCLUDED.tokens >= EXCLUDED.token_limit THEN 0
         WHEN EXCLUDED.request_limit IS NULL THEN ${ASKED}
         ELSE least(${ASKED}, greatest(EXCLUDED.request_limit - ${current('requests')}, 0)) END`;

/**
 * The limit check of the submission statement. `from` names the batch's rows (with
 * `request_limit`, `token_limit` and `precounted` columns); `to` becomes the rows admitted.
 * `verdicts` holds one row per counted submission: `refused`, `by_tokens`, `retry_after`.
 */
export function limitParts(from: string, to: string): Part[] {
  return [
    {
      name: 'limited',
      sql: `SELECT g.ord, g.api_key_id, g.request_limit, g.token_limit, row_number() OVER (PARTITION BY g.api_key_id ORDER BY g.ord) AS nth
    FROM ${from} g
   WHERE (g.request_limit IS NOT NULL OR g.token_limit IS NOT NULL) AND NOT g.precounted
     -- A repeat of a statement whose commit's answer was lost: its submissions were counted then.
     -- A key lookup per row: a scalar subquery is never turned into a join, which (nested loops
     -- being off for batch statements) would read the requests' index whole.
     AND (SELECT true FROM sarsen.requests q WHERE q.id = g.id) IS NULL`,
    },
    {
      name: 'windows',
      // Keys in order, so two statements lock shared window rows in the same order.
      // `tokens`: the window's tokens as this statement reads them, unlocked.
      sql: `INSERT INTO sarsen.key_windows AS w (api_key_id, window_start, requests, refused, last_admitted, request_limit, token_limit, tokens)
  SELECT api_key_id, ${MINUTE}, fresh, asked - fresh, fresh, request_limit, token_limit, spent
    FROM (SELECT a.*, CASE WHEN a.token_limit IS NOT NULL AND a.spent >= a.token_limit THEN 0
                           WHEN a.request_limit IS NULL THEN a.asked ELSE least(a.asked, a.request_limit) END AS fresh
            FROM (SELECT l.api_key_id, count(*)::int AS asked, max(l.request_limit) AS request_limit, max(l.token_limit) AS token_limit,
                         coalesce((SELECT t.tokens FROM sarsen.key_window_tokens t
                                    WHERE t.api_key_id = l.api_key_id AND t.window_start >= ${MINUTE}), 0) AS spent
                    FROM limited l GROUP BY l.api_key_id) AS a) AS f
   ORDER BY api_key_id
  ON CONFLICT (api_key_id) DO UPDATE
    SET ${MOVE_ON}, requests = ${current('requests')} + ${ADMITTED}, refused = ${current('refused')} + ${ASKED} - ${ADMITTED},
        tokens = EXCLUDED.tokens, last_admitted = ${ADMITTED}, request_limit = EXCLUDED.request_limit, token_limit = EXCLUDED.token_limit
  RETURNING w.api_key_id, w.last_admitted, w.token_limit IS NOT NULL AND w.tokens >= w.token_limit AS by_tokens,
            greatest(ceil(extract(epoch FROM w.window_start + interval '1 minute' - now())), 1)::int AS retry_after`,
    },
    {
      name: 'verdicts',
      // A key's submissions are admitted in the order they arrived, as many as its window took.
      sql: `SELECT l.ord, l.nth > w.last_admitted AS refused, w.by_tokens, w.retry_after FROM limited l JOIN windows w ON w.api_key_id = l.api_key_id`,
    },
    {
      name: to,
      // The array is computed before any row passes on: every window row is locked before the
      // statement claims an identity (the order the terminal write also keeps).
      sql: `SELECT g.* FROM ${from} g WHERE g.ord <> ALL (ARRAY(SELECT ord FROM verdicts WHERE refused))`,
    },
  ];
}

/**
 * The terminal write's charge of tokens (input plus output) to the current window of each key
 * that had a token limit when its request was accepted (its row in key_window_tokens). `done`
 * names the settled rows (with `api_key_id`, `token_limited`, `prompt`, `completion`, `total`).
 */
export function tokenChargePart(done: string): Part {
  return {
    name: 'window_tokens',
    sql: `INSERT INTO sarsen.key_window_tokens AS w (api_key_id, window_start, tokens)
  SELECT api_key_id, ${MINUTE}, coalesce(sum(coalesce(total, coalesce(prompt, 0) + coalesce(completion, 0))), 0)
    FROM ${done} WHERE token_limited AND api_key_id IS NOT NULL GROUP BY api_key_id
   ORDER BY api_key_id
  ON CONFLICT (api_key_id) DO UPDATE SET ${MOVE_ON}, tokens = ${current('tokens')} + EXCLUDED.tokens
  RETURNING 1`,
  };
}

export type RateWindow = {
  api_key_id: string;
  requests_per_minute: number | null;
  tokens_per_minute: number | null;
  window_start: Date;
  requests: number;
  tokens: number;
  refused: number;
};

/** Every live limited key of the namespace with its current minute (zeros when nothing counted in it yet). */
export async function rateWindows(pool: Pool, namespaceId: string): Promise<RateWindow[]> {
  const { rows } = await pool.query<RateWindow>(
    `SELECT k.id AS api_key_id, k.requests_per_minute, k.tokens_per_minute, ${MINUTE} AS window_start,
            CASE WHEN w.window_start >= ${MINUTE} THEN w.requests ELSE 0 END AS requests,
            CASE WHEN t.window_start >= ${MINUTE} THEN t.tokens ELSE 0 END AS tokens,
            CASE WHEN w.window_start >= ${MINUTE} THEN w.refused ELSE 0 END AS refused
       FROM sarsen.api_keys k LEFT JOIN sarsen.key_windows w ON w.api_key_id = k.id
            LEFT JOIN sarsen.key_window_tokens t ON t.api_key_id = k.id
      WHERE k.namespace_id = $1 AND k.revoked_at IS NULL AND (k.requests_per_minute IS NOT NULL OR k.tokens_per_minute IS NOT NULL)
      ORDER BY k.id`,
    [namespaceId],
  );
  return rows;
}
