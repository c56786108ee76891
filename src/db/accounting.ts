// Reading the accounts: the request listing, usage, storage, and the tenancy's billing ledger.
// Every read is index-backed and costs the same on a namespace of any size.
import type { Pool } from './pool.ts';

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
};

/** Newest first; `before` is the last id of the previous page (ids sort by creation time). */
export async function listRequests(pool: Pool, namespaceId: string, before: string | null, limit: number): Promise<ListingRow[]> {
  const { rows } = await pool.query<ListingRow>(
    `SELECT q.id, q.status, q.model, q.dialect, q.streaming, q.api_key_id, k.prefix AS api_key_prefix, q.backend_id,
            q.prompt_tokens, q.completion_tokens, q.total_tokens, q.cost_micros,
            q.request_bytes + q.response_bytes + q.chunk_bytes AS stored_bytes,
            q.attempts, q.recoveries, q.created_at, q.started_at, q.finished_at, q.expired
       FROM sarsen.requests q LEFT JOIN sarsen.api_keys k ON k.id = q.api_key_id
      WHERE q.namespace_id = $1 AND ($2::text IS NULL OR q.id < $2)
      ORDER BY q.id DESC
      LIMIT $3`,
    [namespaceId, before, limit],
  );
  return rows;
}

export type Totals = {
  accepted_submissions: number;
  provider_calls: number;
  upstream_sent_bytes: number;
  upstream_received_bytes: number;
  request_bytes: number;
  response_bytes: number;
  chunk_bytes: number;
};

/** The all-time namespace counters: a sum over at most a few shard rows. */
export async function namespaceTotals(pool: Pool, namespaceId: string): Promise<Totals> {
  const { rows } = await pool.query<Totals>(
    `SELECT coalesce(sum(accepted_submissions), 0)::bigint AS accepted_submissions,
            coalesce(sum(provider_calls), 0)::bigint AS provider_calls,
            coalesce(sum(upstream_sent_bytes), 0)::bigint AS upstream_sent_bytes,
            coalesce(sum(upstream_received_bytes), 0)::bigint AS upstream_received_bytes,
            coalesce(sum(request_bytes), 0)::bigint AS request_bytes,
            coalesce(sum(response_bytes), 0)::bigint AS response_bytes,
            coalesce(sum(chunk_bytes), 0)::bigint AS chunk_bytes
       FROM sarsen.usage_rollup WHERE namespace_id = $1`,
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
};

/** Per-key figures from the hourly rollup, over hours starting at or after `since`. */
export async function usageByKey(pool: Pool, namespaceId: string, since: Date): Promise<KeyUsage[]> {
  const { rows } = await pool.query<KeyUsage>(
    `SELECT api_key_id, sum(ledger_events)::bigint AS ledger_events, sum(provider_calls)::bigint AS provider_calls,
            sum(prompt_tokens)::bigint AS prompt_tokens, sum(completion_tokens)::bigint AS completion_tokens,
            sum(total_tokens)::bigint AS total_tokens
       FROM sarsen.key_usage_hourly
      WHERE namespace_id = $1 AND hour >= $2
      GROUP BY api_key_id
      ORDER BY api_key_id`,
    [namespaceId, since],
  );
  return rows;
}

/** The storage counters recomputed from the stored rows themselves (tests and audits). */
export async function recountStorage(pool: Pool, namespaceId: string): Promise<{ request_bytes: number; response_bytes: number; chunk_bytes: number }> {
  const { rows } = await pool.query(
    `SELECT (SELECT coalesce(sum(octet_length(b.body)), 0) FROM sarsen.request_bodies b JOIN sarsen.requests q ON q.id = b.request_id WHERE q.namespace_id = $1)::bigint AS request_bytes,
            (SELECT coalesce(sum(octet_length(r.body)), 0) FROM sarsen.responses r JOIN sarsen.requests q ON q.id = r.request_id WHERE q.namespace_id = $1)::bigint AS response_bytes,
            (SELECT coalesce(sum(octet_length(c.frames)), 0) FROM sarsen.chunks c JOIN sarsen.requests q ON q.id = c.request_id WHERE q.namespace_id = $1)::bigint AS chunk_bytes`,
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
