// SQL of an attempt's life (docs/durability.md "Leases and fencing"): the claim, the lease
// renewals, and the fenced outcomes. Every write after the claim is conditional on the attempt
// number (the fencing token) and on the request still running. The hot statements take a whole
// batch: claims of the jobs a worker pool fetched together, the renewals of every attempt a
// process holds, and the terminal writes that finished while the previous batch was committing.
import type { Pool, PoolClient } from './pool.ts';
import { prepared, withTransaction } from './pool.ts';
import type { Answer, Dialect } from './requests.ts';
import type { BackendForCall } from './backends.ts';
import { enqueueSql } from './jobs.ts';
import { addToRollup, addToBoth } from './counters.ts';
import { notifyEvents } from './events.ts';
import { batchInput, namedParams, oneOfIds, withParts, type Part } from './columns.ts';
import { appendAttempt } from './attempt-log.ts';
import { tokenChargePart, type KeyLimits } from './rate-limits.ts';

export type Attempt = Readonly<{
  id: string;
  /** The fencing token: the request's attempt counter as this attempt set it. */
  attempt: number;
  namespaceId: string;
  dialect: Dialect;
  streaming: boolean;
  forwardedHeaders: readonly (readonly [string, string])[];
  hops: number;
  body: string;
  /** The sequence number this attempt's first stream frame takes. */
  firstSeq: number;
  /** The caller's own provider credential, sealed (caller-credential backends only). */
  sealedCredential: Buffer | null;
  /** Null when the backend was deleted after the request was accepted. */
  backend: BackendForCall | null;
  /** A cancel was asked for before this claim: the attempt ends at once, calling no provider. */
  cancelRequested: boolean;
  /** Its key had a token limit when it was accepted: the terminal write charges its tokens to the key's window. */
  tokenLimited: boolean;
  /** The model the provider is asked for (after the rule's rewrite). */
  model: string;
  /** How many times the request was recovered from a dead attempt before this one. */
  recoveries: number;
  /** The W3C traceparent its acceptance stored (null: tracing was off). */
  traceParent: string | null;
}>;

// `ms`: a double precision SQL expression of milliseconds.
const LEASE_END = (ms: string) => `now() + make_interval(secs => ${ms} / 1000)`;
// Whether any attempt of a request has reached a provider, after one more attempt that did or
// did not; NULL (a request the old rule counted at its claim) stays NULL.
const REACHED = (row: string, attempt: string) => `CASE WHEN ${row}.provider_reached IS NULL THEN NULL ELSE ${row}.provider_reached OR ${attempt} END`;

const CLAIM_INPUT = batchInput<string, { owner: string; lease_ms: number }>([['id', 'text', (id) => id]], { owner: 'text', lease_ms: 'double precision' });
const CLAIM_IDS = CLAIM_INPUT.array('id');

const CLAIM_SQL = withParts(
  [
    {
      name: 'claimed',
      sql: `UPDATE sarsen.requests q
     SET status = 'running', attempts = q.attempts + 1, lease_owner = ${CLAIM_INPUT.param('owner')}, lease_expires_at = ${LEASE_END(CLAIM_INPUT.param('lease_ms'))},
         started_at = coalesce(q.started_at, now()), next_retry_at = NULL, stream_first_seq = q.seq_high + 1,
         attempt_started_at = now()
    FROM (SELECT DISTINCT id FROM ${CLAIM_INPUT.unnest('t')}) AS i
   WHERE q.id = i.id AND ${oneOfIds('q.id', CLAIM_IDS)} AND q.status = 'pending'
  RETURNING q.id, q.attempts, q.namespace_id, q.api_key_id, q.backend_id, q.dialect, q.streaming, q.forwarded_headers,
            q.hops, q.stream_first_seq, q.cancel_requested, q.token_limited, q.upstream_model, q.recoveries, q.trace_parent`,
    },
  ],
  `SELECT c.id, c.attempts, c.namespace_id, c.dialect, c.streaming, c.forwarded_headers, c.hops, c.stream_first_seq,
       c.cancel_requested, c.token_limited, c.upstream_model, c.recoveries, c.trace_parent, b.body, k.sealed AS sealed_credential,
       bk.id AS backend_id, bk.namespace_id AS backend_namespace_id, bk.kind, bk.dialect AS backend_dialect, bk.address,
       bk.credential_source, bk.credential_sealed
  FROM claimed c JOIN sarsen.request_bodies b ON b.request_id = c.id AND ${oneOfIds('b.request_id', CLAIM_IDS)}
  LEFT JOIN sarsen.request_credentials k ON k.request_id = c.id AND k.request_id = ANY(${CLAIM_IDS})
  LEFT JOIN sarsen.backends bk ON bk.id = c.backend_id`,
);
const CLAIM = prepared('sarsen_claim_batch', CLAIM_SQL);

/**
 * Takes pending requests for this worker (`owner`) in one statement; the attempt numbers it
 * answers fence every later write. Requests missing from the answer were settled already or
 * are held by another attempt.
 */
export async function claimAttempts(pool: Pool, ids: readonly string[], owner: string, leaseMs: number): Promise<Map<string, Attempt>> {
  const { rows } = await pool.query(CLAIM(CLAIM_INPUT.values(ids, { owner, lease_ms: leaseMs })));
  return new Map(
    rows.map((r) => [
      r.id,
      {
        id: r.id,
        attempt: r.attempts,
        namespaceId: r.namespace_id,
        dialect: r.dialect,
        streaming: r.streaming,
        forwardedHeaders: r.forwarded_headers,
        hops: r.hops,
        body: r.body,
        firstSeq: r.stream_first_seq,
        sealedCredential: r.sealed_credential,
        backend:
          r.backend_id === null
            ? null
            : {
                backend_id: r.backend_id,
                namespace_id: r.backend_namespace_id,
                kind: r.kind,
                dialect: r.backend_dialect,
                address: r.address,
                credential_source: r.credential_source,
                credential_sealed: r.credential_sealed,
              },
        cancelRequested: r.cancel_requested,
        tokenLimited: r.token_limited,
        model: r.upstream_model,
        recoveries: r.recoveries,
        traceParent: r.trace_parent,
      } satisfies Attempt,
    ]),
  );
}

/** What acceptance has in hand of a submission its own commit claimed. */
export type AcceptedRequest = Pick<Attempt, 'id' | 'namespaceId' | 'dialect' | 'streaming' | 'forwardedHeaders' | 'hops' | 'body' | 'sealedCredential'> &
  Readonly<{ backend: BackendForCall; limits: KeyLimits | null; upstreamModel: string; traceParent?: string | null }>;

/**
 * The attempt a submission's own commit claimed for this process (submissions.ts writes the
 * request running under its lease, attempt 1, its frames from 1, with no job: the watcher
 * recovers it by its lease): made from the submission in hand, as claimAttempts makes one from the rows it
 * claimed, so no statement reads back what was just written.
 */
export function acceptedAttempt(r: AcceptedRequest): Attempt {
  return {
    id: r.id,
    attempt: 1,
    namespaceId: r.namespaceId,
    dialect: r.dialect,
    streaming: r.streaming,
    forwardedHeaders: r.forwardedHeaders,
    hops: r.hops,
    body: r.body,
    firstSeq: 1,
    sealedCredential: r.sealedCredential,
    backend: r.backend,
    cancelRequested: false,
    // As the submission statement sets token_limited.
    tokenLimited: r.limits?.tokensPerMinute != null,
    model: r.upstreamModel,
    recoveries: 0,
    traceParent: r.traceParent ?? null,
  };
}

export type Held = Readonly<{ id: string; attempt: number }>;

const RENEW_INPUT = batchInput<Held, { lease_ms: number }>(
  [
    ['id', 'text', (h) => h.id],
    ['attempt', 'int', (h) => h.attempt],
  ],
  { lease_ms: 'double precision' },
);
const RENEWED_UNTIL = LEASE_END(RENEW_INPUT.param('lease_ms'));

const RENEW_SQL = withParts(
  [
    {
      name: 'renewed',
      sql: `UPDATE sarsen.requests q SET lease_expires_at = ${RENEWED_UNTIL}
    FROM ${RENEW_INPUT.unnest('a')}
   WHERE q.id = a.id AND ${oneOfIds('q.id', RENEW_INPUT.array('id'))} AND q.attempts = a.attempt AND q.status = 'running'
  RETURNING q.id, q.cancel_requested`,
    },
  ],
  `SELECT id, cancel_requested FROM renewed`,
);
const RENEW = prepared('sarsen_renew_leases', RENEW_SQL);

/**
 * Renews the leases of every attempt this process holds; answers the ids it still holds, each
 * with whether a cancel was asked for (the mark a lost `cancel` event cannot hide).
 */
export async function renewLeases(pool: Pool, held: readonly Held[], leaseMs: number): Promise<Map<string, { cancelRequested: boolean }>> {
  const { rows } = await pool.query<{ id: string; cancel_requested: boolean }>(
    RENEW(RENEW_INPUT.values(held, { lease_ms: leaseMs })),
  );
  return new Map(rows.map((r) => [r.id, { cancelRequested: r.cancel_requested }]));
}

export type Tokens = { prompt: number | null; completion: number | null; total: number | null };
/** Whether an attempt reached a provider (a connection carried its request), and its bytes both ways. */
export type Traffic = { reached: boolean; sentBytes: number; receivedBytes: number };

/** How an attempt ended, for its attempt-log entry: the provider's status, or our transport failure's message. */
export type AttemptEnd = { status: number | null; retryAfter: string | null; error: string | null };

/**
 * A fenced terminal write: the answer (a success, or the stored error), what it is counted as,
 * for a stream what its frames hold (the bytes, and the sequence number of the last), and the
 * attempt's log entry (`cancelled`: it ended by a cancel). `model`: the request's upstream model,
 * whose price its tokens are charged at. `ownCredential`: the request brought its caller's
 * credential, which the write destroys. `cacheable`: the answer may be served from the response
 * cache (not a failure, nor a stream the provider ended with its own failure).
 */
export type Terminal = Readonly<
  {
    id: string; attempt: number; model: string; answer: Answer; tokens: Tokens; frames: { bytes: number; lastSeq: number } | null;
    cancelled: boolean; end: AttemptEnd; ownCredential: boolean; tokenLimited: boolean; cacheable: boolean;
  } & Traffic
>;

/**
 * Which optional parts a batch's terminal write needs: each part costs the statement its
 * executor setup on every call even when it writes nothing, so a batch that needs none runs
 * without them. `metering`: debit credit and monthly spend (a deployment setting). `cleanup`:
 * the batch holds a failure (its claim is released) or a request that brought its own
 * credential (destroyed). `limited`: the batch holds a request whose tokens are charged to its
 * key's rate-limit window.
 */
type SettleShape = { metering: boolean; cleanup: boolean; limited: boolean };

const SETTLE_INPUT = batchInput<Terminal, { origin: string }>(
  [
    ['id', 'text', (t) => t.id],
    ['attempt', 'int', (t) => t.attempt],
    ['model', 'text', (t) => t.model],
    ['outcome', 'text', (t) => t.answer.status],
    ['http_status', 'int', (t) => t.answer.httpStatus],
    ['content_type', 'text', (t) => t.answer.contentType],
    ['body', 'binary', (t) => t.answer.body],
    ['error_status', 'int', (t) => t.answer.errorStatus],
    ['retry_after', 'text', (t) => t.answer.retryAfter],
    ['prompt', 'bigint', (t) => t.tokens.prompt],
    ['completion', 'bigint', (t) => t.tokens.completion],
    ['total', 'bigint', (t) => t.tokens.total],
    ['sent', 'bigint', (t) => t.sentBytes],
    ['received', 'bigint', (t) => t.receivedBytes],
    ['chunk_bytes', 'bigint', (t) => t.frames?.bytes ?? 0],
    ['last_seq', 'int', (t) => t.frames?.lastSeq ?? 0],
    ['reached', 'boolean', (t) => t.reached],
    ['ending', 'text', (t) => (t.cancelled ? 'cancelled' : t.answer.status)],
    ['provider_status', 'int', (t) => t.end.status],
    ['transport_error', 'text', (t) => t.end.error],
    ['cacheable', 'boolean', (t) => t.cacheable],
  ],
  { origin: 'text' },
);
const SETTLED_IDS = SETTLE_INPUT.array('id');

// What a request's key counts of its terminal write (counters.ts addToBoth).
const KEYED = `(outcome = 'succeeded' OR provider_call OR coalesce(prompt, completion, total) IS NOT NULL)`;

// A part that writes returns nothing unless another part reads it: a RETURNING list is one more
// projection to set up, per partition, on every call.
/** What every terminal write does: the input, its cost, the fenced update, the answer, the counters and the ledger. */
const SETTLE_PARTS: readonly Part[] = [
  {
    name: 'input',
    // Token cost at the model's price (micro-credits per million tokens, rounded up); no price,
    // no charge. A failure carries tokens only when it was cancelled mid-stream: what was
    // produced is charged. The model comes with the answer, so pricing reads no request row; a
    // key lookup per answer (a subquery in the select list is never turned into a join).
    // Priced here, in the one part that reads the parameters, and materialized, so that the
    // lookup runs once per answer and the update joins its rows once (a part of its own was
    // inlined into the update's join and its lookup planned twice).
    materialized: true,
    sql: `SELECT i.*, coalesce((
      SELECT (ceil(coalesce(i.prompt, 0) * p.prompt_micros_per_mtok / 1e6)
            + ceil(coalesce(i.completion, 0) * p.completion_micros_per_mtok / 1e6))::bigint
        FROM sarsen.prices p WHERE p.model = i.model), 0) AS micros
    FROM (${SETTLE_INPUT.rows}) AS i`,
  },
  {
    name: 'done',
    sql: `UPDATE sarsen.requests q
     SET status = i.outcome, finished_at = now(), lease_owner = NULL, lease_expires_at = NULL, next_retry_at = NULL,
         prompt_tokens = i.prompt, completion_tokens = i.completion, total_tokens = i.total,
         error_status = i.error_status, retry_after = i.retry_after, response_bytes = octet_length(i.body),
         chunk_bytes = i.chunk_bytes, seq_high = greatest(q.seq_high, i.last_seq),
         cost_micros = q.cost_micros + i.micros, provider_reached = ${REACHED('q', 'i.reached')},
         attempt_log = ${appendAttempt('q', { ending: 'i.ending', status: 'i.provider_status', retryAfter: 'i.retry_after', error: 'i.transport_error' })},
         attempt_started_at = NULL,
         -- An answer the cache may not serve loses the key it would be found under.
         cache_key = CASE WHEN i.cacheable THEN q.cache_key END
    FROM input i
   WHERE q.id = i.id AND ${oneOfIds('q.id', SETTLED_IDS)} AND q.attempts = i.attempt AND q.status = 'running'
  RETURNING q.id, q.tenancy_id, q.namespace_id, q.api_key_id, i.micros, i.outcome, i.http_status, i.content_type, i.body,
            i.prompt, i.completion, i.total, i.sent, i.received,
            -- The request's provider call, counted once, now it has settled (NULL: counted by the old rule).
            coalesce(q.provider_reached, false) AS provider_call, q.token_limited`,
  },
  { name: 'answer', sql: `INSERT INTO sarsen.responses (request_id, status, content_type, body) SELECT id, http_status, content_type, body FROM done` },
  {
    name: 'rollup',
    // One delta per namespace and key: the namespace's provider calls and traffic, and the key's
    // hour (its token entries, provider calls and tokens) where the request still has its key and
    // settled with something a key counts. A provider call is such a thing, so the calls of a
    // keyed delta count for its namespace and its key alike.
    sql: `${addToBoth(
      ['provider_calls', 'upstream_sent_bytes', 'upstream_received_bytes', 'response_bytes'],
      ['ledger_events', 'prompt_tokens', 'completion_tokens', 'total_tokens'],
      `SELECT namespace_id, api_key_id, bool_or(${KEYED}) AS keyed,
            count(*) FILTER (WHERE provider_call) AS provider_calls, sum(sent) AS upstream_sent_bytes,
            sum(received) AS upstream_received_bytes, sum(octet_length(body)) AS response_bytes,
            count(*) FILTER (WHERE micros > 0 AND ${KEYED}) AS ledger_events,
            sum(prompt) FILTER (WHERE ${KEYED}) AS prompt_tokens, sum(completion) FILTER (WHERE ${KEYED}) AS completion_tokens,
            sum(total) FILTER (WHERE ${KEYED}) AS total_tokens
       FROM done GROUP BY namespace_id, api_key_id`,
    )}`,
  },
  {
    name: 'entry',
    sql: `INSERT INTO sarsen.ledger (tenancy_id, namespace_id, api_key_id, request_id, kind, amount_micros)
  SELECT tenancy_id, namespace_id, api_key_id, id, 'tokens', micros FROM done WHERE micros > 0`,
  },
];

/** The credential destroyed, and a failure's claim released: the same body afterwards is a new request. */
const CLEANUP_PARTS: readonly Part[] = [
  {
    name: 'forgotten',
    // The ids as one array (an index scan of them), not a join: a join builds a hash table even for one row.
    sql: `DELETE FROM sarsen.request_credentials k WHERE k.request_id = ANY (ARRAY(SELECT id FROM done))`,
  },
  {
    name: 'released',
    sql: `DELETE FROM sarsen.idempotency_claims k WHERE k.request_id = ANY (ARRAY(SELECT id FROM done WHERE outcome = 'failed'))`,
  },
];

/** The token cost debited from the tenancy's credit and added to the month's spend of its key and namespace. */
const METERING_PARTS: readonly Part[] = [
  {
    name: 'charged',
    sql: `UPDATE sarsen.credit c SET balance_micros = c.balance_micros - t.micros
    FROM (SELECT tenancy_id, sum(micros) AS micros FROM done WHERE micros > 0 GROUP BY tenancy_id) AS t
   WHERE c.tenancy_id = t.tenancy_id`,
  },
  {
    name: 'spent',
    sql: `INSERT INTO sarsen.monthly_spend (scope_id, month, spent_micros)
  SELECT scope, date_trunc('month', now())::date, sum(p.micros)
    FROM done p, LATERAL (VALUES (p.api_key_id), (p.namespace_id)) AS s(scope)
   WHERE p.micros > 0 AND scope IS NOT NULL
   GROUP BY scope
  ON CONFLICT (scope_id, month) DO UPDATE SET spent_micros = monthly_spend.spent_micros + EXCLUDED.spent_micros`,
  },
];

// One bus event per request, sent as the answer is read (so before the parts that are not read
// run, as when it was a part of its own): a part would cost two more nodes to set up.
const NOTIFIED = notifyEvents(`SELECT id AS request_id, 'state' AS event, outcome AS arg FROM done`, SETTLE_INPUT.param('origin'));

const settleSql = (shape: SettleShape): string =>
  withParts(
    [
      ...SETTLE_PARTS,
      // Before the claims are released: every statement locks a key's window rows before claims.
      ...(shape.limited ? [tokenChargePart('done')] : []),
      ...(shape.cleanup ? CLEANUP_PARTS : []),
      ...(shape.metering ? METERING_PARTS : []),
    ],
    `SELECT id, (${NOTIFIED}) AS side_effects FROM done`,
  );

const settleName = (shape: SettleShape): string =>
  `sarsen_settle_batch${shape.metering ? '_metered' : ''}${shape.cleanup ? '_cleanup' : ''}${shape.limited ? '_limited' : ''}`;

/** The terminal write of each shape, a named statement of its own, made at load. */
const SETTLE_SHAPES: readonly SettleShape[] = [false, true].flatMap((metering) =>
  [false, true].flatMap((cleanup) => [false, true].map((limited) => ({ metering, cleanup, limited }))),
);
const SETTLE_SQL = new Map(SETTLE_SHAPES.map((shape) => [settleName(shape), settleSql(shape)]));
const SETTLE = new Map([...SETTLE_SQL].map(([name, text]) => [name, prepared(name, text)]));

/** The statements' text by name (test/sql-snapshots holds a copy of each). */
export const ATTEMPT_SQL: Readonly<Record<string, string>> = {
  sarsen_claim_batch: CLAIM_SQL,
  sarsen_renew_leases: RENEW_SQL,
  ...Object.fromEntries(SETTLE_SQL),
};

/**
 * The terminal writes of a batch of attempts in one statement (a group commit): answers,
 * tokens, token cost (ledger, and a credit debit when metering), counters, the credential
 * destroyed, a failure's claim released, and one bus event each.
 * Answers the ids written; an attempt missing from it had lost its lease, and wrote nothing.
 */
export async function settleBatch(
  pool: Pool | PoolClient,
  ts: readonly Terminal[],
  opts: { metering: boolean; origin: string },
): Promise<Set<string>> {
  const cleanup = ts.some((t) => t.ownCredential || t.answer.status === 'failed');
  const limited = ts.some((t) => t.tokenLimited);
  const statement = SETTLE.get(settleName({ metering: opts.metering, cleanup, limited }))!;
  const { rows } = await pool.query<{ id: string }>(statement(SETTLE_INPUT.values(ts, { origin: opts.origin })));
  return new Set(rows.map((r) => r.id));
}

// The statements of a retry: rare, one request at a time, each parameter named.
const RETRY = namedParams<{
  id: string; attempt: number; delay_ms: number; reached: boolean; provider_status: number | null; retry_after: string | null; transport_error: string | null;
}>({ id: 'text', attempt: 'int', delay_ms: 'double precision', reached: 'boolean', provider_status: 'int', retry_after: 'text', transport_error: 'text' });
const RETRY_SQL = `UPDATE sarsen.requests q
    SET status = 'pending', lease_owner = NULL, lease_expires_at = NULL,
        -- A fallback backend is tried next, at once; without one, the same backend after the backoff.
        next_retry_at = CASE WHEN cardinality(q.fallback_backend_ids) > 0 THEN now() ELSE ${LEASE_END(RETRY.param('delay_ms'))} END,
        backend_id = coalesce(q.fallback_backend_ids[1], q.backend_id), fallback_backend_ids = q.fallback_backend_ids[2:],
        provider_reached = ${REACHED('q', RETRY.param('reached'))},
        attempt_log = ${appendAttempt('q', { ending: `'retried'`, status: RETRY.param('provider_status'), retryAfter: RETRY.param('retry_after'), error: RETRY.param('transport_error') })},
        attempt_started_at = NULL
  WHERE id = ${RETRY.param('id')} AND attempts = ${RETRY.param('attempt')} AND status = 'running'
  RETURNING next_retry_at`;

const REQUEUE = namedParams<{ id: string; run_at: Date }>({ id: 'text', run_at: 'timestamptz' });
const REQUEUE_SQL = `SELECT ${enqueueSql(REQUEUE.param('id'), REQUEUE.param('run_at'))}`;

const TRAFFIC = namedParams<{ id: string; sent: number; received: number }>({ id: 'text', sent: 'bigint', received: 'bigint' });
const TRAFFIC_SQL = addToRollup(
  ['upstream_sent_bytes', 'upstream_received_bytes'],
  `SELECT namespace_id, ${TRAFFIC.param('sent')} AS upstream_sent_bytes, ${TRAFFIC.param('received')} AS upstream_received_bytes FROM sarsen.requests WHERE id = ${TRAFFIC.param('id')}`,
);

const PENDING = namedParams<{ id: string; origin: string }>({ id: 'text', origin: 'text' });
const PENDING_SQL = `WITH n AS (${notifyEvents(`SELECT ${PENDING.param('id')} AS request_id, 'state' AS event, 'pending' AS arg`, PENDING.param('origin'))}) SELECT count(*) FROM n`;

/** Fenced hand-back for a later attempt: back to pending, due at `delayMs`, with its job. */
export async function scheduleRetry(pool: Pool, f: { id: string; attempt: number; delayMs: number; origin: string; end: AttemptEnd } & Traffic): Promise<boolean> {
  return withTransaction(pool, async (c) => {
    const { rows } = await c.query<{ next_retry_at: Date }>(
      RETRY_SQL,
      RETRY.values({
        id: f.id, attempt: f.attempt, delay_ms: f.delayMs, reached: f.reached,
        provider_status: f.end.status, retry_after: f.end.retryAfter, transport_error: f.end.error,
      }),
    );
    const row = rows[0];
    if (!row) return false;
    await c.query(REQUEUE_SQL, REQUEUE.values({ id: f.id, run_at: row.next_retry_at }));
    await c.query(TRAFFIC_SQL, TRAFFIC.values({ id: f.id, sent: f.sentBytes, received: f.receivedBytes }));
    await c.query(PENDING_SQL, PENDING.values({ id: f.id, origin: f.origin }));
    return true;
  });
}
