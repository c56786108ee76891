// Submission SQL (docs/api.md "What happens to a submission"; docs/durability.md "Group
// commits"): one statement accepts a whole batch of submissions (a group commit). For each it
// claims the body's identity or attaches to the live claim, and writes the request, its body, the
// ledger entry, the counters and, for work another executor is to pick up, the graphile-worker
// job. Identical bodies inside one batch end as one execution. A submission the accepting process will run itself is written already claimed
// (running, attempt 1, its lease) and with no job, so no job pickup sits between acceptance and
// the provider call; should that process die, the watcher recovers it by its lease. With
// metering on, each submission is its own transaction: credit and spend caps are checked and
// debited under row locks. A batch holding a key with limits, or a submission the response cache
// applies to, runs a shape of the statement with those parts (rate-limits.ts, response-cache.ts);
// a batch with neither runs the statement without them. So do the jobs (a batch whose every
// submission this process claims writes none) and a caller's sealed credential.
import type { Pool, PoolClient } from './pool.ts';
import { prepared, withTransaction } from './pool.ts';
import type { Dialect, RequestStatus } from './requests.ts';
import { insertJobsSql, wakeWorkersForSql } from './jobs.ts';
import { addToBoth } from './counters.ts';
import { batchInput, namedParams, withParts, type Column, type Part } from './columns.ts';
import { limitParts, type KeyLimits, type Refused } from './rate-limits.ts';
import { cacheLookupParts, TAKEOVER } from './response-cache.ts';

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
  /** The key's rate limits, null when it has none. */
  limits: KeyLimits | null;
  /** Counted against the key's window by an earlier statement (one that could not place it). */
  precounted: boolean;
  /**
   * The response cache, null when the namespace has none: the key answers of this body are
   * stored under, how old an answer it takes, and whether its own answer may be served later.
   */
  cache: Readonly<{ key: Buffer; lifeMs: number; store: boolean }> | null;
  /** The W3C traceparent of the request's trace when tracing is on (docs/operations.md "Tracing"). */
  traceParent?: string | null;
}>;

export type SubmitSettings = Readonly<{ windowMs: number; feeMicros: number; leaseMs: number }>;

export type Submitted = Readonly<{
  requestId: string;
  /** False: the submission started this execution. True: it landed on one already live. */
  attached: boolean;
  status: RequestStatus;
  /** The job of an execution this submission started (its key is the request id). */
  jobId: string | null;
  /** The request this submission's answer was copied from, when the response cache answered it (a request of its own, succeeded). */
  cachedFrom: string | null;
}>;

export type { Refused } from './rate-limits.ts';

/**
 * Which optional parts a batch's statement needs: `limits`, some key has a rate limit; `cache`,
 * the response cache applies to some submission; `owned`, every submission is claimed for the
 * accepting process (no job, and no executor woken for one); `sealed`, some submission brought
 * its caller's credential. A part costs the statement its executor setup on every call even
 * when it writes nothing, so a batch runs the shape with only the parts it needs.
 */
type SubmitShape = Readonly<{ limits: boolean; cache: boolean; owned: boolean; sealed: boolean }>;

type Scalars = { window_ms: number; fee_micros: number; lease_ms: number };

const BASE_COLUMNS: readonly Column<NewRequest>[] = [
    ['id', 'text', (r) => r.id],
    ['tenancy_id', 'text', (r) => r.tenancyId],
    ['namespace_id', 'text', (r) => r.namespaceId],
    ['api_key_id', 'text', (r) => r.apiKeyId],
    ['backend_id', 'text', (r) => r.backendId],
    ['dialect', 'text', (r) => r.dialect],
    ['streaming', 'boolean', (r) => r.streaming],
    ['model', 'text', (r) => r.model],
    ['upstream_model', 'text', (r) => r.upstreamModel],
    ['headers', 'text', (r) => JSON.stringify(r.forwardedHeaders)],
    ['hops', 'int', (r) => r.hops],
    ['body', 'text', (r) => r.body],
    ['identity', 'bytea', (r) => r.identity],
    ['sealed', 'bytea', (r) => r.sealedCredential],
    ['owner', 'text', (r) => r.owner],
    // Comma-joined (ids never hold a comma): unnest cannot take an array of arrays of different lengths.
    ['fallbacks', 'text', (r) => r.fallbackBackendIds.join(',')],
    ['trace_parent', 'text', (r) => r.traceParent ?? null],
];
const LIMIT_COLUMNS: readonly Column<NewRequest>[] = [
  ['request_limit', 'int', (r) => r.limits?.requestsPerMinute ?? null],
  ['token_limit', 'bigint', (r) => r.limits?.tokensPerMinute ?? null],
  ['precounted', 'boolean', (r) => r.precounted],
];
const CACHE_COLUMNS: readonly Column<NewRequest>[] = [
  ['cache_key', 'bytea', (r) => r.cache?.key ?? null],
  ['cache_ms', 'bigint', (r) => r.cache?.lifeMs ?? null],
  ['cache_store', 'boolean', (r) => r.cache?.store ?? null],
];

// One array per column, cut into rows by `unnest`; the settings after them.
const inputOf = (shape: SubmitShape) =>
  batchInput<NewRequest, Scalars>(
    [...BASE_COLUMNS, ...(shape.limits ? LIMIT_COLUMNS : []), ...(shape.cache ? CACHE_COLUMNS : [])],
    { window_ms: 'double precision', fee_micros: 'bigint', lease_ms: 'double precision' },
  );

// `claimed`: the submission lands on a claim this batch took. A submission that lands on its own
// id without one is the same submission tried again, after its first try's answer was lost:
// nothing is written for it.
const LANDED = `request_id IS NOT NULL AND (claimed OR request_id <> id)`;
const NEW = `request_id = id`;

function submitSql(shape: SubmitShape): string {
  const INPUT = inputOf(shape);
  const LEASE_END = `now() + make_interval(secs => ${INPUT.param('lease_ms')} / 1000)`;
  const FEE = INPUT.param('fee_micros');
  // The rows as given, then through the limit check, then the response cache: what remains claims an identity (`input`).
  const first = shape.limits ? 'given' : shape.cache ? 'offered' : 'input';
  const front: Part[] = [{ name: first, sql: INPUT.rows }];
  if (shape.limits) front.push(...limitParts('given', shape.cache ? 'offered' : 'input'));
  if (shape.cache) front.push(...cacheLookupParts('offered', 'input'));
  // A request row's optional columns: whether its tokens are charged to its key's window, and its cache key.
  const extraColumns = `${shape.limits ? ', token_limited' : ''}${shape.cache ? ', cache_key' : ''}`;
  const extraValues = `${shape.limits ? ', token_limit IS NOT NULL' : ''}${shape.cache ? ', CASE WHEN cache_store THEN cache_key END' : ''}`;

  // A part that writes returns nothing (no RETURNING) unless a later part or the answer reads it:
  // a RETURNING list is one more projection to set up, per partition, on every call.
  const parts: Part[] = [
    ...front,
    {
      name: 'claim',
      sql: `INSERT INTO sarsen.idempotency_claims AS k (namespace_id, identity, request_id, expires_at)
  SELECT DISTINCT ON (namespace_id, identity) namespace_id, identity, id, now() + make_interval(secs => ${INPUT.param('window_ms')} / 1000)
    FROM input ORDER BY namespace_id, identity, ord
  ON CONFLICT (namespace_id, identity) DO UPDATE SET request_id = EXCLUDED.request_id, expires_at = EXCLUDED.expires_at
   WHERE k.expires_at <= now()${shape.cache ? ` OR ${TAKEOVER('input')}` : ''}
  RETURNING k.namespace_id, k.identity, k.request_id`,
    },
    {
      name: 'placed',
      // Where each submission lands: an execution this batch claimed (its own, or an identical
      // body's earlier in the batch) or the live one an earlier statement claimed. NULL: a claim
      // committed after this statement's snapshot; nothing is written and it is submitted again.
      // `claimed`: it lands on a claim of this batch (LANDED). The lookup is named once: each
      // mention of it would be planned as a lookup of its own.
      sql: `SELECT i.*, coalesce(c.request_id, l.request_id) AS request_id, c.request_id IS NOT NULL AS claimed
    FROM input i
    LEFT JOIN claim c ON c.namespace_id = i.namespace_id AND c.identity = i.identity
    -- A key lookup per submission (a subquery in the select list is never turned into a join).
    CROSS JOIN LATERAL (
      SELECT CASE WHEN c.request_id IS NULL${shape.cache ? ' AND i.takeover_of IS NULL' : ''} THEN (
        SELECT k.request_id FROM sarsen.idempotency_claims k
         WHERE k.namespace_id = i.namespace_id AND k.identity = i.identity AND k.expires_at > now()) END AS request_id
    ) AS l`,
    },
    { name: 'created', sql: `SELECT * FROM placed WHERE ${NEW} AND claimed` },
    {
      name: 'request',
      sql: `INSERT INTO sarsen.requests (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model,
    forwarded_headers, hops, request_bytes, cost_micros, status, attempts, lease_owner, lease_expires_at, started_at, stream_first_seq, attempt_started_at, fallback_backend_ids, trace_parent${extraColumns})
  SELECT id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model,
         headers::jsonb, hops, octet_length(body), ${FEE},
         CASE WHEN owner IS NULL THEN 'pending' ELSE 'running' END, CASE WHEN owner IS NULL THEN 0 ELSE 1 END,
         owner, CASE WHEN owner IS NOT NULL THEN ${LEASE_END} END, CASE WHEN owner IS NOT NULL THEN now() END,
         CASE WHEN owner IS NOT NULL THEN 1 END, CASE WHEN owner IS NOT NULL THEN now() END,
         coalesce(string_to_array(nullif(fallbacks, ''), ','), '{}'), trace_parent${extraValues}
    FROM created`,
    },
    { name: 'body', sql: `INSERT INTO sarsen.request_bodies (request_id, body) SELECT id, body FROM created` },
    ...(shape.sealed ? [{ name: 'credential', sql: `INSERT INTO sarsen.request_credentials (request_id, sealed) SELECT id, sealed FROM created WHERE sealed IS NOT NULL` }] : []),
    ...(shape.owned ? [] : [JOB]),
    {
      name: 'entry',
      sql: `INSERT INTO sarsen.ledger (tenancy_id, namespace_id, api_key_id, request_id, kind, amount_micros)
  SELECT tenancy_id, namespace_id, api_key_id, request_id,
         CASE WHEN ${NEW} THEN 'execution' ELSE 'attach' END, CASE WHEN ${NEW} THEN ${FEE} ELSE 0 END
    FROM placed WHERE ${LANDED} ORDER BY ord`,
    },
    shape.cache ? COUNTED_WITH_HITS : COUNTED,
  ];
  return withParts(parts, finalSelect(shape));
}

const JOB: Part = {
  name: 'job',
  // Work another executor is to run, due now. Work this process claimed has none: should this
  // process die or lose the database, the watcher re-dispatches it once its owner is found
  // dead or its lease expired (docs/durability.md "Run where accepted"); a job would only be
  // written for the terminal write to delete.
  sql: insertJobsSql(`SELECT id, now() AS run_at FROM created WHERE owner IS NULL`),
};

// One delta per namespace and key counts what landed: its submissions, the bytes of the bodies
// it stored, and its ledger entries (each landed submission writes one).
const COUNTED: Part = {
  name: 'counted',
  sql: `${addToBoth(
    ['accepted_submissions', 'request_bytes'],
    ['ledger_events'],
    `SELECT namespace_id, api_key_id, true AS keyed, count(*) AS accepted_submissions,
            coalesce(sum(octet_length(body)) FILTER (WHERE ${NEW}), 0) AS request_bytes, count(*) AS ledger_events
       FROM placed WHERE ${LANDED} GROUP BY namespace_id, api_key_id`,
  )}`,
};

// With the cache, one delta per namespace and key counts both kinds of submission: those that
// landed on an execution, and those answered from the cache (a ledger entry each).
const COUNTED_WITH_HITS: Part = {
  name: 'counted',
  sql: `${addToBoth(
    ['accepted_submissions', 'request_bytes', 'response_bytes', 'chunk_bytes', 'cache_hits'],
    ['ledger_events'],
    `SELECT namespace_id, api_key_id, true AS keyed, count(*) AS accepted_submissions, sum(request_bytes) AS request_bytes, sum(response_bytes) AS response_bytes,
            sum(chunk_bytes) AS chunk_bytes, sum(cache_hits) AS cache_hits, count(*) AS ledger_events
       FROM (SELECT namespace_id, api_key_id, CASE WHEN ${NEW} THEN octet_length(body) ELSE 0 END AS request_bytes, 0 AS response_bytes, 0 AS chunk_bytes, 0 AS cache_hits
               FROM placed WHERE ${LANDED}
             UNION ALL
             SELECT namespace_id, api_key_id, request_bytes, response_bytes, chunk_bytes, 1 FROM served) AS landed
      GROUP BY namespace_id, api_key_id`,
  )}`,
};

// An executor woken for the jobs written (wake_executors, at commit), as the answer is read: a
// part of its own would cost more nodes to set up.
const WOKEN = `(${wakeWorkersForSql(`SELECT 1 FROM created WHERE owner IS NULL`)}) AS woken`;
// The job a submission's new execution was given (none in an owned shape).
const JOB_JOIN = `\n  LEFT JOIN job j ON j.key = p.request_id AND p.request_id = p.id`;

/** One answer row per submission, in order. */
function finalSelect(shape: SubmitShape): string {
  if (!shape.limits && !shape.cache) {
    return `SELECT p.request_id, p.request_id = p.id AS created, ${shape.owned ? 'NULL::text' : 'j.id::text'} AS job_id,
       -- A request this batch created is reported pending (docs/durability.md "Request states":
       -- accepted is pending), even when this process claimed it in the same statement and it
       -- is running already.
       -- is running already. (A submission lands on a request this batch created exactly when it
       -- lands on a claim this batch took.)
       CASE WHEN p.claimed THEN 'pending' ELSE (SELECT q.status FROM sarsen.requests q WHERE q.id = p.request_id) END AS status,
       ${shape.owned ? 'NULL AS woken' : WOKEN}
  FROM placed p${shape.owned ? '' : JOB_JOIN}
 ORDER BY p.ord`;
  }
  const first = shape.limits ? 'given' : 'offered';
  return `SELECT ${shape.cache ? 'coalesce(h.id, p.request_id)' : 'p.request_id'} AS request_id, coalesce(p.request_id = p.id, false) AS created, ${shape.owned ? 'NULL::text' : 'j.id::text'} AS job_id,
       CASE WHEN ${shape.cache ? "h.id IS NOT NULL THEN 'succeeded' WHEN " : ''}p.claimed THEN 'pending' ELSE (SELECT q.status FROM sarsen.requests q WHERE q.id = p.request_id) END AS status,
       ${shape.cache ? 'h.source_id' : 'NULL::text'} AS cached_from,
       ${shape.limits ? "CASE WHEN v.refused THEN CASE WHEN v.by_tokens THEN 'tokens' ELSE 'requests' END END" : 'NULL::text'} AS refused,
       ${shape.limits ? 'v.retry_after' : 'NULL::int'} AS retry_after,
       ${shape.owned ? 'NULL AS woken' : WOKEN}
  FROM ${first} g
  LEFT JOIN placed p ON p.ord = g.ord${shape.owned ? '' : JOB_JOIN}${shape.cache ? '\n  LEFT JOIN hits h ON h.ord = g.ord' : ''}${shape.limits ? '\n  LEFT JOIN verdicts v ON v.ord = g.ord' : ''}
 ORDER BY g.ord`;
}

const shapeName = (shape: SubmitShape): string =>
  `sarsen_submit_batch${shape.limits ? '_limited' : ''}${shape.cache ? '_cached' : ''}${shape.owned ? '_owned' : ''}${shape.sealed ? '_sealed' : ''}`;

/** The submission statement of each shape, a named statement of its own, made at load. */
const BOTH = [false, true] as const;
const SHAPES: readonly SubmitShape[] = BOTH.flatMap((limits) =>
  BOTH.flatMap((cache) => BOTH.flatMap((owned) => BOTH.map((sealed) => ({ limits, cache, owned, sealed })))),
);
const SUBMIT_SQL = new Map(SHAPES.map((shape) => [shapeName(shape), submitSql(shape)]));
const SUBMIT = new Map(SHAPES.map((shape) => [shapeName(shape), { statement: prepared(shapeName(shape), SUBMIT_SQL.get(shapeName(shape))!), input: inputOf(shape) }]));

/** The statements' text by name (test/sql-snapshots holds a copy of each). */
export const SUBMISSION_SQL: Readonly<Record<string, string>> = Object.fromEntries(SUBMIT_SQL);

/**
 * Accepts a batch of submissions in one statement. The answer lines up with `rs`; null means
 * "submit it again" (an identical body's claim was committed concurrently); a refusal, that the
 * submission's key is over its rate limit (nothing was written for it).
 */
export async function submitBatch(
  db: Pool | PoolClient,
  rs: readonly NewRequest[],
  s: SubmitSettings,
): Promise<(Submitted | Refused | null)[]> {
  const shape = {
    limits: rs.some((r) => r.limits !== null), cache: rs.some((r) => r.cache !== null),
    owned: rs.length > 0 && rs.every((r) => r.owner !== null), sealed: rs.some((r) => r.sealedCredential !== null),
  };
  const { statement, input } = SUBMIT.get(shapeName(shape))!;
  const { rows } = await db.query<{
    request_id: string | null; created: boolean; job_id: string | null; status: RequestStatus | null;
    cached_from?: string | null; refused?: 'requests' | 'tokens' | null; retry_after?: number | null;
  }>(statement(input.values(rs, { window_ms: s.windowMs, fee_micros: s.feeMicros, lease_ms: s.leaseMs })));
  return rows.map((row) => {
    if (row.refused) return { refused: row.refused, retryAfterSeconds: row.retry_after! };
    if (row.request_id === null) return null;
    return { requestId: row.request_id, attached: !row.created && !row.cached_from, status: row.status!, jobId: row.job_id, cachedFrom: row.cached_from ?? null };
  });
}

/** Whether a statement's answer for a submission is a refusal by its key's rate limit. */
export const isRefused = (r: Submitted | Refused | null): r is Refused => r !== null && 'refused' in r;

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

// The metering statements: one submission at a time, each parameter named.
const CREDIT = namedParams<{ tenancy_id: string }>({ tenancy_id: 'text' });
const CREDIT_SQL = `SELECT balance_micros FROM sarsen.credit WHERE tenancy_id = ${CREDIT.param('tenancy_id')} FOR UPDATE`;

/** The month's spend rows of a submission's two scopes: its key and its namespace. */
const SCOPES = namedParams<{ api_key_id: string; namespace_id: string }>({ api_key_id: 'text', namespace_id: 'text' });
const SPEND_ROWS_SQL = `INSERT INTO sarsen.monthly_spend (scope_id, month)
  VALUES (${SCOPES.param('api_key_id')}, ${MONTH}), (${SCOPES.param('namespace_id')}, ${MONTH}) ON CONFLICT DO NOTHING`;
const CAPS_SQL = `SELECT s.scope_id AS scope, s.spent_micros AS spent,
         coalesce((SELECT spend_limit FROM sarsen.api_keys WHERE id = s.scope_id),
                  (SELECT spend_limit FROM sarsen.namespaces WHERE id = s.scope_id)) AS cap
    FROM sarsen.monthly_spend s
   WHERE s.scope_id IN (${SCOPES.param('api_key_id')}, ${SCOPES.param('namespace_id')}) AND s.month = ${MONTH}
   ORDER BY s.scope_id
   FOR UPDATE OF s`;

const DEBIT = namedParams<{ tenancy_id: string; micros: number }>({ tenancy_id: 'text', micros: 'bigint' });
const DEBIT_SQL = `UPDATE sarsen.credit SET balance_micros = balance_micros - ${DEBIT.param('micros')} WHERE tenancy_id = ${DEBIT.param('tenancy_id')}`;

const SPEND = namedParams<{ api_key_id: string; namespace_id: string; micros: number }>({ api_key_id: 'text', namespace_id: 'text', micros: 'bigint' });
const SPEND_SQL = `UPDATE sarsen.monthly_spend SET spent_micros = spent_micros + ${SPEND.param('micros')}
   WHERE scope_id IN (${SPEND.param('api_key_id')}, ${SPEND.param('namespace_id')}) AND month = ${MONTH}`;

/** Checks credit and the key's and namespace's caps under row locks. */
async function checkMetering(c: PoolClient, r: NewRequest): Promise<void> {
  const credit = await c.query<{ balance_micros: number }>(CREDIT_SQL, CREDIT.values({ tenancy_id: r.tenancyId }));
  if ((credit.rows[0]?.balance_micros ?? 0) <= 0) {
    throw new MeteringRefusal('insufficient_credits', 'The tenancy has no credit left.');
  }
  const scopes = SCOPES.values({ api_key_id: r.apiKeyId, namespace_id: r.namespaceId });
  await c.query(SPEND_ROWS_SQL, scopes);
  const { rows } = await c.query<{ scope: string; spent: number; cap: number | null }>(CAPS_SQL, scopes);
  for (const row of rows) {
    if (row.cap !== null && row.spent >= row.cap) {
      const what = row.scope === r.apiKeyId ? 'API key' : 'namespace';
      throw new MeteringRefusal('spend_limit_reached', `The ${what}'s spend limit for this month (${row.cap} micro-credits) is reached.`);
    }
  }
}

async function debit(c: PoolClient, r: NewRequest, micros: number): Promise<void> {
  if (micros <= 0) return;
  await c.query(DEBIT_SQL, DEBIT.values({ tenancy_id: r.tenancyId, micros }));
  await c.query(SPEND_SQL, SPEND.values({ api_key_id: r.apiKeyId, namespace_id: r.namespaceId, micros }));
}

/**
 * One submission on a metering deployment, in its own transaction: only a new execution costs
 * anything (an attach or an answer from the cache is never refused for credit), and a refusal
 * rolls the whole submission back. Null, as for a batch: submit it again.
 */
export async function submitMetered(pool: Pool, r: NewRequest, s: SubmitSettings): Promise<Submitted | Refused | null> {
  return withTransaction(pool, (c) => submitMeteredIn(c, r, s));
}

/** submitMetered inside the caller's transaction (the batch dispatcher's); a refusal throws, for the caller to roll back. */
export async function submitMeteredIn(c: PoolClient, r: NewRequest, s: SubmitSettings): Promise<Submitted | Refused | null> {
  const [submitted] = await submitBatch(c, [r], s);
  // An answer from the cache is no new execution: like an attach, it costs nothing.
  if (submitted && !isRefused(submitted) && !submitted.attached && submitted.cachedFrom === null) {
    await checkMetering(c, r);
    await debit(c, r, s.feeMicros);
  }
  return submitted ?? null;
}
