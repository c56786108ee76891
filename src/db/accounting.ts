// Reading the accounts: the request listing, usage, storage, and the tenancy's billing ledger.
// Every read is index-backed and costs the same on a namespace of any size.
import type { Pool } from './pool.ts';
import { prepared } from './pool.ts';
import { firstIdAt } from '../core/ids.ts';
import type { ListingFilter } from '../core/listing-filter.ts';
import { RETIRED } from './partitions.ts';
import { ROLLUP_COLUMNS, type RollupColumn } from './counters.ts';

export type ListingRow = {
  id: string;
  status: string;
  model: string;
  dialect: string;
  streaming: boolean;
  api_key_id: string | null;
  api_key_prefix: string | null;
  backend_id: string;
  prompt_tokens: number | null;
  completion_tokens: number | null;
  total_tokens: number | null;
  cost_micros: number;
  stored_bytes: number;
  attempts: number;
  recoveries: number;
  created_at: Date;
  started_at: Date | null;
  finished_at: Date | null;
  expired: boolean;
  cached_from: string | null;
  /** The batch the request is a line of (docs/api.md "Batches"), or null. */
  batch_id: string | null;
};

/** The listing row's columns (of `q`, the request, and `k`, its key), as the export reads them too. */
export const LISTING_COLUMNS = `q.id, q.status, q.model, q.dialect, q.streaming, q.api_key_id, k.prefix AS api_key_prefix, q.backend_id,
            q.prompt_tokens, q.completion_tokens, q.total_tokens, q.cost_micros,
            CASE WHEN q.id < ${RETIRED} THEN 0 ELSE q.request_bytes + q.response_bytes + q.chunk_bytes END AS stored_bytes,
            q.attempts, q.recoveries, q.created_at, q.started_at, q.finished_at, q.expired OR q.id < ${RETIRED} AS expired, q.cached_from,
            (SELECT bl.batch_id FROM sarsen.batch_lines bl WHERE bl.request_id = q.id ORDER BY bl.batch_id LIMIT 1) AS batch_id`;
export const LISTING_FROM = 'sarsen.requests q LEFT JOIN sarsen.api_keys k ON k.id = q.api_key_id';

const LISTING_SELECT = `SELECT ${LISTING_COLUMNS}
       FROM ${LISTING_FROM}`;

// How far a request's id (the clock of the process that accepted it) and its created_at (the
// database's clock) may disagree. The time range filters created_at exactly; the id range
// widened by this much only lets the scan start and stop in the namespace's id index.
const CLOCK_SLACK_MS = 5 * 60_000;

/**
 * Newest first; `before` is the last id of the previous page (ids sort by creation time).
 * Filters only add terms: each indexed through migrations 014 (key, model, failed) and 021
 * (dialect) or the pending/running partial indexes, the time range through the id index.
 */
export async function listRequests(pool: Pool, namespaceId: string, before: string | null, limit: number, filter: ListingFilter = {}): Promise<ListingRow[]> {
  const params: unknown[] = [namespaceId];
  const where = ['q.namespace_id = $1'];
  const term = (sql: (p: string) => string, value: unknown) => {
    params.push(value);
    where.push(sql(`$${params.length}`));
  };
  if (before !== null) term((p) => `q.id < ${p}`, before);
  if (filter.status !== undefined) term((p) => `q.status = ${p}`, filter.status);
  if (filter.model !== undefined) term((p) => `q.model = ${p}`, filter.model);
  if (filter.dialect !== undefined) term((p) => `q.dialect = ${p}`, filter.dialect);
  if (filter.api_key_id !== undefined) term((p) => `q.api_key_id = ${p}`, filter.api_key_id);
  if (filter.created_since !== undefined) {
    term((p) => `q.created_at >= ${p}`, filter.created_since);
    term((p) => `q.id >= ${p}`, firstIdAt('req', filter.created_since.getTime() - CLOCK_SLACK_MS));
  }
  if (filter.created_before !== undefined) {
    term((p) => `q.created_at < ${p}`, filter.created_before);
    term((p) => `q.id < ${p}`, firstIdAt('req', filter.created_before.getTime() + CLOCK_SLACK_MS));
  }
  params.push(limit);
  const { rows } = await pool.query<ListingRow>(`${LISTING_SELECT} WHERE ${where.join(' AND ')} ORDER BY q.id DESC LIMIT $${params.length}`, params);
  return rows;
}

/** One request's listing row, kept after the sweep like the listing's; null when unknown. */
export async function findListingRow(pool: Pool, namespaceId: string, id: string): Promise<ListingRow | null> {
  const { rows } = await pool.query<ListingRow>(`${LISTING_SELECT} WHERE q.namespace_id = $1 AND q.id = $2`, [namespaceId, id]);
  return rows[0] ?? null;
}

/** The namespace totals, one number per counter column. */
export type Totals = Record<RollupColumn, number>;

/**
 * The all-time namespace counters: the folded rows (a few shards) and the deltas not yet folded
 * (of both delta tables), in one snapshot, so each delta is counted once (src/db/counters.ts).
 */
export async function namespaceTotals(pool: Pool, namespaceId: string): Promise<Totals> {
  const { rows } = await pool.query<Totals>(
    `SELECT ${ROLLUP_COLUMNS.map((c) => `coalesce(sum(${c}), 0)::bigint AS ${c}`).join(', ')}
       FROM (SELECT ${ROLLUP_COLUMNS.join(', ')} FROM sarsen.usage_rollup WHERE namespace_id = $1
             UNION ALL
             SELECT ${ROLLUP_COLUMNS.join(', ')} FROM sarsen.usage_rollup_deltas WHERE namespace_id = $1
             UNION ALL
             SELECT ${ROLLUP_COLUMNS.join(', ')} FROM sarsen.counter_deltas WHERE namespace_id = $1) AS counted`,
    [namespaceId],
  );
  return rows[0]!;
}

export type KeyUsage = {
  api_key_id: string;
  ledger_events: number;
  provider_calls: number;
  prompt_tokens: number | null;
  completion_tokens: number | null;
  total_tokens: number | null;
  cache_hits: number;
};

const USAGE_BY_KEY = prepared(
  'sarsen_usage_by_key',
  `WITH edge AS (
  -- The first hour at or after \`since\`, as date_trunc counts hours: the counters use it too.
  SELECT CASE WHEN date_trunc('hour', $2::timestamptz) = $2::timestamptz THEN $2::timestamptz
              ELSE date_trunc('hour', $2::timestamptz) + interval '1 hour' END AS hour
), events AS (
  SELECT h.api_key_id, h.ledger_events, h.provider_calls, h.prompt_tokens, h.completion_tokens, h.total_tokens, h.cache_hits
    FROM sarsen.key_usage_hourly h, edge
   WHERE h.namespace_id = $1 AND h.hour >= edge.hour
  UNION ALL
  -- What the watcher has not folded into them yet (src/db/counters.ts), from the same snapshot.
  SELECT d.api_key_id, d.ledger_events, d.provider_calls, d.prompt_tokens, d.completion_tokens, d.total_tokens, d.cache_hits
    FROM sarsen.key_usage_deltas d, edge
   WHERE d.namespace_id = $1 AND d.hour >= edge.hour
  UNION ALL
  -- (A delta that adds to a namespace and its key has the key's hour: its provider calls and
  -- cache hits count for both, and a figure it does not add is NULL.)
  SELECT d.api_key_id, coalesce(d.ledger_events, 0), coalesce(d.provider_calls, 0), d.prompt_tokens, d.completion_tokens, d.total_tokens, coalesce(d.cache_hits, 0)
    FROM sarsen.counter_deltas d, edge
   WHERE d.namespace_id = $1 AND d.hour >= edge.hour
  UNION ALL
  -- The part of since's hour inside the window, from the events the hourly rows were added
  -- from, at the same instants: each ledger entry at its creation (an answer from the cache is one)...
  SELECT l.api_key_id, 1, 0, NULL, NULL, NULL, CASE WHEN l.kind = 'cached' THEN 1 ELSE 0 END
    FROM sarsen.ledger l, edge
   WHERE l.namespace_id = $1 AND l.created_at >= $2 AND l.created_at < edge.hour AND l.api_key_id IS NOT NULL
  UNION ALL
  -- ...and a request's provider call and tokens at its terminal write (one answered from the
  -- cache had neither: its tokens are the original's).
  SELECT q.api_key_id, 0, CASE WHEN q.provider_reached THEN 1 ELSE 0 END,
         CASE WHEN q.status = 'succeeded' THEN q.prompt_tokens END,
         CASE WHEN q.status = 'succeeded' THEN q.completion_tokens END,
         CASE WHEN q.status = 'succeeded' THEN q.total_tokens END, 0
    FROM sarsen.requests q, edge
   -- Swept or not: both ranges of the namespace's index by finish time (migration 032).
   WHERE q.namespace_id = $1 AND q.expired = ANY ('{false,true}'::boolean[]) AND q.status IN ('succeeded', 'failed')
     AND q.finished_at >= $2 AND q.finished_at < edge.hour
     AND q.api_key_id IS NOT NULL AND (q.status = 'succeeded' OR q.provider_reached) AND q.cached_from IS NULL
)
SELECT api_key_id, sum(ledger_events)::bigint AS ledger_events, sum(provider_calls)::bigint AS provider_calls,
       sum(prompt_tokens)::bigint AS prompt_tokens, sum(completion_tokens)::bigint AS completion_tokens,
       sum(total_tokens)::bigint AS total_tokens, sum(cache_hits)::bigint AS cache_hits
  FROM events
 GROUP BY api_key_id
 ORDER BY api_key_id`,
);

/**
 * Per-key figures over the window from `since` (exact to the millisecond) to now: whole hours
 * from the hourly rollup and its deltas, and the rest of the hour `since` falls in from the
 * ledger and the request rows (an index range over at most that hour). A token sum is null when nothing in
 * the window reported one.
 */
export async function usageByKey(pool: Pool, namespaceId: string, since: Date): Promise<KeyUsage[]> {
  const { rows } = await pool.query<KeyUsage>(USAGE_BY_KEY([namespaceId, since]));
  return rows;
}

/** The storage counters recomputed from the stored rows themselves (tests and audits). */
export async function recountStorage(pool: Pool, namespaceId: string): Promise<{ request_bytes: number; response_bytes: number; chunk_bytes: number }> {
  const { rows } = await pool.query(
    `SELECT (SELECT coalesce(sum(octet_length(b.body)), 0) FROM sarsen.request_bodies b JOIN sarsen.requests q ON q.id = b.request_id WHERE q.namespace_id = $1)::bigint AS request_bytes,
            (SELECT coalesce(sum(octet_length(r.body)), 0) FROM sarsen.responses r JOIN sarsen.requests q ON q.id = r.request_id WHERE q.namespace_id = $1)::bigint AS response_bytes,
            (SELECT coalesce(sum(coalesce(c.bytes, octet_length(c.frames))), 0) FROM sarsen.chunks c JOIN sarsen.requests q ON q.id = c.request_id WHERE q.namespace_id = $1)::bigint AS chunk_bytes`,
    [namespaceId],
  );
  return rows[0];
}

export type LedgerRow = {
  id: number;
  namespace_id: string;
  api_key_id: string | null;
  request_id: string;
  kind: string;
  amount_micros: number;
  created_at: Date;
};

export async function ledgerPage(pool: Pool, tenancyId: string, before: number | null, limit: number): Promise<LedgerRow[]> {
  const { rows } = await pool.query<LedgerRow>(
    `SELECT id, namespace_id, api_key_id, request_id, kind, amount_micros, created_at FROM sarsen.ledger
      WHERE tenancy_id = $1 AND ($2::bigint IS NULL OR id < $2) ORDER BY id DESC LIMIT $3`,
    [tenancyId, before, limit],
  );
  return rows;
}

export async function creditBalance(pool: Pool, tenancyId: string): Promise<number> {
  const { rows } = await pool.query<{ balance_micros: number }>(`SELECT balance_micros FROM sarsen.credit WHERE tenancy_id = $1`, [tenancyId]);
  return rows[0]?.balance_micros ?? 0;
}

/** Adds credit (micro-credits) to a tenancy named by slug; null when no such tenancy. */
export async function grantCredit(pool: Pool, slug: string, micros: number): Promise<number | null> {
  const { rows } = await pool.query<{ balance_micros: number }>(
    `INSERT INTO sarsen.credit (tenancy_id, balance_micros)
     SELECT id, $2 FROM sarsen.tenancies WHERE slug = $1
     ON CONFLICT (tenancy_id) DO UPDATE SET balance_micros = credit.balance_micros + EXCLUDED.balance_micros
     RETURNING balance_micros`,
    [slug, micros],
  );
  return rows[0]?.balance_micros ?? null;
}

export async function setPrice(pool: Pool, model: string, promptPerMtok: number, completionPerMtok: number): Promise<void> {
  await pool.query(
    `INSERT INTO sarsen.prices (model, prompt_micros_per_mtok, completion_micros_per_mtok) VALUES ($1, $2, $3)
     ON CONFLICT (model) DO UPDATE SET prompt_micros_per_mtok = $2, completion_micros_per_mtok = $3, updated_at = now()`,
    [model, promptPerMtok, completionPerMtok],
  );
}
