// Submission SQL (SPEC.md "Submission"; DESIGN.md section 3): one statement claims the body's
// identity or attaches to the live claim, writes the request, its body, the ledger entry and
// the counters, and enqueues the job. With metering on, the credit and spend caps are checked
// and debited in the same transaction, under row locks, so concurrent submissions cannot
// overspend by more than one request's fee.
import type { Pool, PoolClient } from './pool.ts';
import { withTransaction } from './pool.ts';
import type { Dialect, RequestStatus } from './requests.ts';
import { enqueueSql } from './jobs.ts';

const ROLLUP_SHARDS = 16;
/** Counters are sharded so concurrent writers do not queue on one row; reads sum the shards. */
export const shard = (): number => Math.floor(Math.random() * ROLLUP_SHARDS);
/**
 * Per-key hourly rows see far fewer writers than a namespace's counters, and GET /usage reads
 * one row per key, hour and shard of its window: a few shards keep that read small.
 */
export const KEY_SHARDS = 4;

export type NewRequest = Readonly<{
  id: string;
  tenancyId: string;
  namespaceId: string;
  apiKeyId: string;
  backendId: string;
  dialect: Dialect;
  streaming: boolean;
  model: string;
  upstreamModel: string;
  forwardedHeaders: readonly (readonly [string, string])[];
  hops: number;
  body: string;
  identity: Buffer;
  windowMs: number;
  feeMicros: number;
  /** A caller-credential backend's credential, sealed for the request id it will belong to. */
  sealedCredential: ((requestId: string) => Buffer) | null;
}>;

export type Submitted = { requestId: string; attached: boolean; status: RequestStatus };

export type Metering = { enabled: boolean };

/** A submission refused by metering; the caller maps it to its 402. */
export class MeteringRefusal extends Error {
  override name = 'MeteringRefusal';
  readonly reason: 'insufficient_credits' | 'spend_limit_reached';
  constructor(reason: 'insufficient_credits' | 'spend_limit_reached', message: string) {
    super(message);
    this.reason = reason;
  }
}

const SUBMIT = `
WITH claim AS (
  INSERT INTO sarsen.idempotency_claims (namespace_id, identity, request_id, expires_at)
  VALUES ($3, $14, $1, now() + make_interval(secs => $15::double precision / 1000))
  ON CONFLICT (namespace_id, identity) DO UPDATE
    SET request_id = EXCLUDED.request_id, expires_at = EXCLUDED.expires_at
    WHERE idempotency_claims.expires_at <= now()
  RETURNING request_id
), live AS (
  SELECT q.id, q.status FROM sarsen.idempotency_claims k JOIN sarsen.requests q ON q.id = k.request_id
   WHERE k.namespace_id = $3 AND k.identity = $14 AND NOT EXISTS (SELECT 1 FROM claim)
), request AS (
  INSERT INTO sarsen.requests (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model,
    upstream_model, forwarded_headers, hops, request_bytes, cost_micros)
  SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, octet_length($12::text), $16 FROM claim
  RETURNING id
), body AS (
  INSERT INTO sarsen.request_bodies (request_id, body) SELECT $1, $12 FROM claim RETURNING 1
), job AS (
  SELECT ${enqueueSql('$1::text')} FROM claim
), entry AS (
  INSERT INTO sarsen.ledger (tenancy_id, namespace_id, api_key_id, request_id, kind, amount_micros)
  SELECT $2, $3, $4, coalesce((SELECT request_id FROM claim), (SELECT id FROM live)),
         CASE WHEN EXISTS (SELECT 1 FROM claim) THEN 'execution' ELSE 'attach' END,
         CASE WHEN EXISTS (SELECT 1 FROM claim) THEN $16::bigint ELSE 0 END
   WHERE EXISTS (SELECT 1 FROM claim) OR EXISTS (SELECT 1 FROM live)
  RETURNING 1
), counted AS (
  INSERT INTO sarsen.usage_rollup (namespace_id, shard, accepted_submissions, request_bytes)
  SELECT $3, $13, 1, CASE WHEN EXISTS (SELECT 1 FROM claim) THEN octet_length($12::text) ELSE 0 END
   WHERE EXISTS (SELECT 1 FROM entry)
  ON CONFLICT (namespace_id, shard) DO UPDATE
    SET accepted_submissions = usage_rollup.accepted_submissions + 1,
        request_bytes = usage_rollup.request_bytes + EXCLUDED.request_bytes
  RETURNING 1
), credential AS (
  INSERT INTO sarsen.request_credentials (request_id, sealed) SELECT $1, $17 FROM claim WHERE $17::bytea IS NOT NULL RETURNING 1
), hourly AS (
  INSERT INTO sarsen.key_usage_hourly (namespace_id, api_key_id, hour, shard, ledger_events)
  SELECT $3, $4, date_trunc('hour', now()), $13::int % ${KEY_SHARDS}, 1 WHERE EXISTS (SELECT 1 FROM entry)
  ON CONFLICT (namespace_id, hour, api_key_id, shard) DO UPDATE SET ledger_events = key_usage_hourly.ledger_events + 1
  RETURNING 1
)
SELECT (SELECT request_id FROM claim) AS created,
       (SELECT id FROM live) AS live_id, (SELECT status FROM live) AS live_status,
       (SELECT count(*) FROM request) + (SELECT count(*) FROM body) + (SELECT count(*) FROM job)
         + (SELECT count(*) FROM counted) + (SELECT count(*) FROM hourly) + (SELECT count(*) FROM credential) AS writes`;

async function submitOnce(db: Pool | PoolClient, r: NewRequest): Promise<Submitted | null> {
  const { rows } = await db.query<{ created: string | null; live_id: string | null; live_status: RequestStatus | null }>(SUBMIT, [
    r.id, r.tenancyId, r.namespaceId, r.apiKeyId, r.backendId, r.dialect, r.streaming, r.model, r.upstreamModel,
    JSON.stringify(r.forwardedHeaders), r.hops, r.body, shard(), r.identity, r.windowMs, r.feeMicros,
    r.sealedCredential?.(r.id) ?? null,
  ]);
  const row = rows[0]!;
  if (row.created) return { requestId: row.created, attached: false, status: 'pending' };
  if (row.live_id) return { requestId: row.live_id, attached: true, status: row.live_status! };
  // The live claim was committed after this statement's snapshot was taken (or released in
  // between): nothing was written; claim afresh.
  return null;
}

const MONTH = `date_trunc('month', now())::date`;

/** Checks credit and the key's and namespace's caps under row locks (metering on only). */
async function checkMetering(c: PoolClient, r: NewRequest): Promise<void> {
  const credit = await c.query<{ balance_micros: number }>(
    `SELECT balance_micros FROM sarsen.credit WHERE tenancy_id = $1 FOR UPDATE`,
    [r.tenancyId],
  );
  if ((credit.rows[0]?.balance_micros ?? 0) <= 0) {
    throw new MeteringRefusal('insufficient_credits', 'The tenancy has no credit left.');
  }
  await c.query(
    `INSERT INTO sarsen.monthly_spend (scope_id, month) VALUES ($1, ${MONTH}), ($2, ${MONTH}) ON CONFLICT DO NOTHING`,
    [r.apiKeyId, r.namespaceId],
  );
  const { rows } = await c.query<{ scope: string; spent: number; cap: number | null }>(
    `SELECT s.scope_id AS scope, s.spent_micros AS spent,
            coalesce((SELECT spend_limit FROM sarsen.api_keys WHERE id = s.scope_id),
                     (SELECT spend_limit FROM sarsen.namespaces WHERE id = s.scope_id)) AS cap
       FROM sarsen.monthly_spend s
      WHERE s.scope_id IN ($1, $2) AND s.month = ${MONTH}
      ORDER BY s.scope_id
      FOR UPDATE OF s`,
    [r.apiKeyId, r.namespaceId],
  );
  for (const row of rows) {
    if (row.cap !== null && row.spent >= row.cap) {
      const what = row.scope === r.apiKeyId ? 'API key' : 'namespace';
      throw new MeteringRefusal('spend_limit_reached', `The ${what}'s spend limit for this month (${row.cap} micro-credits) is reached.`);
    }
  }
}

async function debit(c: PoolClient, r: NewRequest, micros: number): Promise<void> {
  if (micros <= 0) return;
  await c.query(`UPDATE sarsen.credit SET balance_micros = balance_micros - $2 WHERE tenancy_id = $1`, [r.tenancyId, micros]);
  await c.query(
    `UPDATE sarsen.monthly_spend SET spent_micros = spent_micros + $3 WHERE scope_id IN ($1, $2) AND month = ${MONTH}`,
    [r.apiKeyId, r.namespaceId, micros],
  );
}

/**
 * Accepts a submission: a new execution, or an attach to the live one with the same identity.
 * Concurrent identical submissions serialise on the claim's primary key, so exactly one of
 * them creates the request.
 */
export async function submitRequest(pool: Pool, r: NewRequest, metering: Metering): Promise<Submitted> {
  for (;;) {
    const result = metering.enabled
      ? await withTransaction(pool, async (c) => {
          const s = await submitOnce(c, r);
          // Only a new execution costs anything: an attach is never refused for credit.
          if (s && !s.attached) {
            await checkMetering(c, r); // a refusal rolls the whole submission back
            await debit(c, r, r.feeMicros);
          }
          return s;
        })
      : await submitOnce(pool, r);
    if (result) return result;
  }
}
