// Submission SQL (SPEC.md "Submission"; DESIGN.md section 3): one statement accepts a whole
// batch of submissions (a group commit). For each it claims the body's identity or attaches to
// the live claim, and writes the request, its body, the ledger entry, the counters and the
// graphile-worker job. Identical bodies inside one batch end as one execution. A submission the
// accepting process will run itself is written already claimed (running, attempt 1, its lease),
// so no job pickup sits between acceptance and the provider call; its job is due when the lease
// ends, as the backstop should that process die. With metering on, each submission is its own
// transaction: credit and spend caps are checked and debited under row locks.
import type { Pool, PoolClient } from './pool.ts';
import { prepared, withTransaction } from './pool.ts';
import type { Dialect, RequestStatus } from './requests.ts';
import { insertJobsSql, wakeWorkersSql } from './jobs.ts';
import { addToRollup, addToKeyHour, shard } from './counters.ts';
import { arrayLiteral, type Element } from './columns.ts';

export type NewRequest = Readonly<{
  id: string;
  tenancyId: string;
  namespaceId: string;
  apiKeyId: string;
  backendId: string;
  /** The rule's fallback backends, tried in order after retryable failures. */
  fallbackBackendIds: readonly string[];
  dialect: Dialect;
  streaming: boolean;
  model: string;
  upstreamModel: string;
  forwardedHeaders: readonly (readonly [string, string])[];
  hops: number;
  body: string;
  identity: Buffer;
  /** A caller-credential backend's credential, sealed for this request id. */
  sealedCredential: Buffer | null;
  /** This process's lease owner, when it will run the request itself should it be new. */
  owner: string | null;
}>;

export type SubmitSettings = Readonly<{ windowMs: number; feeMicros: number; leaseMs: number }>;

export type Submitted = Readonly<{
  requestId: string;
  /** False: the submission started this execution. True: it landed on one already live. */
  attached: boolean;
  status: RequestStatus;
  /** The job of an execution this submission started (its key is the request id). */
  jobId: string | null;
}>;

const LEASE_END = `now() + make_interval(secs => $18::double precision / 1000)`;
const LANDED = `request_id IS NOT NULL AND NOT repeated`;
const NEW = `request_id = id`;

const SUBMIT = prepared(
  'sarsen_submit_batch',
  `WITH input AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::boolean[], $8::text[],
                       $9::text[], $10::text[], $11::int[], $12::text[], $13::bytea[], $14::bytea[], $15::text[], $20::text[])
    WITH ORDINALITY AS t(id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model,
                         upstream_model, headers, hops, body, identity, sealed, owner, fallbacks, ord)
), claim AS (
  INSERT INTO sarsen.idempotency_claims AS k (namespace_id, identity, request_id, expires_at)
  SELECT DISTINCT ON (namespace_id, identity) namespace_id, identity, id, now() + make_interval(secs => $16::double precision / 1000)
    FROM input ORDER BY namespace_id, identity, ord
  ON CONFLICT (namespace_id, identity) DO UPDATE SET request_id = EXCLUDED.request_id, expires_at = EXCLUDED.expires_at
   WHERE k.expires_at <= now()
  RETURNING k.namespace_id, k.identity, k.request_id
), placed AS (
  -- Where each submission lands: an execution this batch claimed (its own, or an identical
  -- body's earlier in the batch) or the live one an earlier statement claimed. NULL: a claim
  -- committed after this statement's snapshot; nothing is written and it is submitted again.
  -- \`repeated\`: this very submission, tried again after its first try's answer was lost.
  SELECT i.*, coalesce(c.request_id, l.request_id) AS request_id, coalesce(l.request_id = i.id, false) AS repeated
    FROM input i
    LEFT JOIN claim c ON c.namespace_id = i.namespace_id AND c.identity = i.identity
    -- A key lookup per submission (a subquery in the select list is never turned into a join).
    CROSS JOIN LATERAL (
      SELECT CASE WHEN c.request_id IS NULL THEN (
        SELECT k.request_id FROM sarsen.idempotency_claims k
         WHERE k.namespace_id = i.namespace_id AND k.identity = i.identity AND k.expires_at > now()) END AS request_id
    ) AS l
), created AS (
  SELECT * FROM placed WHERE ${NEW} AND NOT repeated
), request AS (
  INSERT INTO sarsen.requests (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model,
    forwarded_headers, hops, request_bytes, cost_micros, status, attempts, lease_owner, lease_expires_at, started_at, stream_first_seq, attempt_started_at, fallback_backend_ids)
  SELECT id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model,
         headers::jsonb, hops, octet_length(body), $17,
         CASE WHEN owner IS NULL THEN 'pending' ELSE 'running' END, CASE WHEN owner IS NULL THEN 0 ELSE 1 END,
         owner, CASE WHEN owner IS NOT NULL THEN ${LEASE_END} END, CASE WHEN owner IS NOT NULL THEN now() END,
         CASE WHEN owner IS NOT NULL THEN 1 END, CASE WHEN owner IS NOT NULL THEN now() END,
         -- Comma-joined (ids never hold a comma): unnest cannot take an array of arrays of different lengths.
         coalesce(string_to_array(nullif(fallbacks, ''), ','), '{}')
    FROM created
  RETURNING 1
), body AS (
  INSERT INTO sarsen.request_bodies (request_id, body) SELECT id, body FROM created RETURNING 1
), credential AS (
  INSERT INTO sarsen.request_credentials (request_id, sealed) SELECT id, sealed FROM created WHERE sealed IS NOT NULL RETURNING 1
), job AS (
  -- Work another executor is to run is due now; work this process claimed is due when its
  -- lease ends, the backstop should this process die holding it.
  ${insertJobsSql(`SELECT id, CASE WHEN owner IS NULL THEN now() ELSE ${LEASE_END} END AS run_at FROM created`)}
), woken AS (
  ${wakeWorkersSql(`(SELECT count(*) FROM created WHERE owner IS NULL)`)}
), entry AS (
  INSERT INTO sarsen.ledger (tenancy_id, namespace_id, api_key_id, request_id, kind, amount_micros)
  SELECT tenancy_id, namespace_id, api_key_id, request_id,
         CASE WHEN ${NEW} THEN 'execution' ELSE 'attach' END, CASE WHEN ${NEW} THEN $17::bigint ELSE 0 END
    FROM placed WHERE ${LANDED} ORDER BY ord
  RETURNING 1
), counted AS (
  ${addToRollup(
    ['accepted_submissions', 'request_bytes'],
    `SELECT namespace_id, count(*) AS accepted_submissions,
            coalesce(sum(octet_length(body)) FILTER (WHERE ${NEW}), 0) AS request_bytes
       FROM placed WHERE ${LANDED} GROUP BY namespace_id`,
    '$19',
  )}
  RETURNING 1
), hourly AS (
  ${addToKeyHour(
    ['ledger_events'],
    `SELECT namespace_id, api_key_id, count(*) AS ledger_events FROM placed WHERE ${LANDED} GROUP BY namespace_id, api_key_id`,
    '$19',
  )}
  RETURNING 1
)
SELECT p.request_id, p.request_id = p.id AS created, j.id::text AS job_id,
       -- A request this batch created is reported pending (SPEC.md: accepted is pending), even when
       -- this process claimed it in the same statement and it is running already.
       CASE WHEN m.id IS NULL THEN (SELECT q.status FROM sarsen.requests q WHERE q.id = p.request_id) ELSE 'pending' END AS status,
       (SELECT count(*) FROM woken) AS woken
  FROM placed p
  LEFT JOIN created m ON m.id = p.request_id
  LEFT JOIN job j ON j.key = p.request_id AND p.request_id = p.id
 ORDER BY p.ord`,
);

/**
 * Accepts a batch of submissions in one statement. The answer lines up with `rs`; null means
 * "submit it again" (an identical body's claim was committed concurrently).
 */
export async function submitBatch(
  db: Pool | PoolClient,
  rs: readonly NewRequest[],
  s: SubmitSettings,
  counterShard: number,
): Promise<(Submitted | null)[]> {
  const col = (f: (r: NewRequest) => Element) => arrayLiteral(rs.map(f));
  const { rows } = await db.query<{ request_id: string | null; created: boolean; job_id: string | null; status: RequestStatus | null }>(
    SUBMIT([
      col((r) => r.id), col((r) => r.tenancyId), col((r) => r.namespaceId), col((r) => r.apiKeyId), col((r) => r.backendId),
      col((r) => r.dialect), col((r) => r.streaming), col((r) => r.model), col((r) => r.upstreamModel),
      col((r) => JSON.stringify(r.forwardedHeaders)), col((r) => r.hops), col((r) => r.body), col((r) => r.identity),
      col((r) => r.sealedCredential), col((r) => r.owner), s.windowMs, s.feeMicros, s.leaseMs, counterShard,
      col((r) => r.fallbackBackendIds.join(',')),
    ]),
  );
  return rows.map((row) =>
    row.request_id === null ? null : { requestId: row.request_id, attached: !row.created, status: row.status!, jobId: row.job_id },
  );
}

/** A submission refused by metering; the caller maps it to its 402. */
export class MeteringRefusal extends Error {
  override name = 'MeteringRefusal';
  readonly reason: 'insufficient_credits' | 'spend_limit_reached';
  constructor(reason: 'insufficient_credits' | 'spend_limit_reached', message: string) {
    super(message);
    this.reason = reason;
  }
}

const MONTH = `date_trunc('month', now())::date`;

/** Checks credit and the key's and namespace's caps under row locks. */
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
 * One submission on a metering deployment, in its own transaction: only a new execution costs
 * anything (an attach is never refused for credit), and a refusal rolls the whole submission
 * back. Null, as for a batch: submit it again.
 */
export async function submitMetered(pool: Pool, r: NewRequest, s: SubmitSettings): Promise<Submitted | null> {
  return withTransaction(pool, async (c) => {
    // Metered submissions run concurrently, each its own transaction: any shard will do.
    const [submitted] = await submitBatch(c, [r], s, shard());
    if (submitted && !submitted.attached) {
      await checkMetering(c, r);
      await debit(c, r, s.feeMicros);
    }
    return submitted ?? null;
  });
}
