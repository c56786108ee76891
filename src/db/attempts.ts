// SQL of an attempt's life (DESIGN.md "Leases"): the claim, the lease renewals, and the fenced
// outcomes. Every write after the claim is conditional on the attempt number (the fencing
// token) and on the request still running. The hot statements take a whole batch: claims of
// the jobs a worker pool fetched together, the renewals of every attempt a process holds, and
// the terminal writes that finished while the previous batch was committing.
import type { Pool, PoolClient } from './pool.ts';
import { prepared, withTransaction } from './pool.ts';
import type { Answer, Dialect } from './requests.ts';
import type { BackendForCall } from './backends.ts';
import { enqueueSql, removeBackstopJobsSql, rescheduleJobsSql } from './jobs.ts';
import { addToRollup, addToKeyHour, shard } from './counters.ts';
import { notifyEvents } from './events.ts';
import { arrayLiteral, binaryColumn, binarySlice, type Element } from './columns.ts';
import { appendAttempt } from './attempt-log.ts';

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
  /** The job of an attempt claimed at acceptance (due when its lease ends); removed by the terminal write. */
  jobId: string | null;
  /** A cancel was asked for before this claim: the attempt ends at once, calling no provider. */
  cancelRequested: boolean;
}>;

const LEASE_END = (param: string) => `now() + make_interval(secs => ${param}::double precision / 1000)`;
// Whether any attempt of a request has reached a provider, after one more attempt that did or
// did not; NULL (a request the old rule counted at its claim) stays NULL.
const REACHED = (row: string, attempt: string) => `CASE WHEN ${row}.provider_reached IS NULL THEN NULL ELSE ${row}.provider_reached OR ${attempt} END`;

const CLAIM = prepared(
  'sarsen_claim_batch',
  `WITH claimed AS (
  UPDATE sarsen.requests q
     SET status = 'running', attempts = q.attempts + 1, lease_owner = $2, lease_expires_at = ${LEASE_END('$3')},
         started_at = coalesce(q.started_at, now()), next_retry_at = NULL, stream_first_seq = q.seq_high + 1,
         attempt_started_at = now()
    FROM (SELECT DISTINCT id FROM unnest($1::text[]) AS id) AS i
   WHERE q.id = i.id AND q.id = ANY($1::text[]) AND q.status = 'pending'
  RETURNING q.id, q.attempts, q.namespace_id, q.api_key_id, q.backend_id, q.dialect, q.streaming, q.forwarded_headers,
            q.hops, q.stream_first_seq, q.cancel_requested
)
SELECT c.id, c.attempts, c.namespace_id, c.dialect, c.streaming, c.forwarded_headers, c.hops, c.stream_first_seq,
       c.cancel_requested, b.body, k.sealed AS sealed_credential,
       bk.id AS backend_id, bk.namespace_id AS backend_namespace_id, bk.kind, bk.dialect AS backend_dialect, bk.address,
       bk.credential_source, bk.credential_sealed
  FROM claimed c JOIN sarsen.request_bodies b ON b.request_id = c.id AND b.request_id = ANY($1::text[])
  LEFT JOIN sarsen.request_credentials k ON k.request_id = c.id AND k.request_id = ANY($1::text[])
  LEFT JOIN sarsen.backends bk ON bk.id = c.backend_id`,
);

/**
 * Takes pending requests for this worker (`owner`) in one statement; the attempt numbers it
 * answers fence every later write. Requests missing from the answer were settled already or
 * are held by another attempt.
 */
export async function claimAttempts(pool: Pool, ids: readonly string[], owner: string, leaseMs: number): Promise<Map<string, Attempt>> {
  const { rows } = await pool.query(CLAIM([ids, owner, leaseMs]));
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
        jobId: null,
        cancelRequested: r.cancel_requested,
      } satisfies Attempt,
    ]),
  );
}

export type Held = Readonly<{ id: string; attempt: number; jobId: string | null }>;

const RENEW = prepared(
  'sarsen_renew_leases',
  `WITH renewed AS (
  UPDATE sarsen.requests q SET lease_expires_at = ${LEASE_END('$4')}
    FROM unnest($1::text[], $2::int[], $3::bigint[]) AS a(id, attempt, job_id)
   WHERE q.id = a.id AND q.id = ANY($1::text[]) AND q.attempts = a.attempt AND q.status = 'running'
  RETURNING q.id, a.job_id, q.cancel_requested
), moved AS (
  -- An attempt claimed at acceptance keeps its backstop job due at its lease's end.
  SELECT j.id FROM ${rescheduleJobsSql(`ARRAY(SELECT job_id FROM renewed WHERE job_id IS NOT NULL)`, LEASE_END('$4'))} AS j
)
SELECT id, cancel_requested, (SELECT count(*) FROM moved) AS moved FROM renewed`,
);

/**
 * Renews the leases of every attempt this process holds; answers the ids it still holds, each
 * with whether a cancel was asked for (the mark a lost `cancel` event cannot hide).
 */
export async function renewLeases(pool: Pool, held: readonly Held[], leaseMs: number): Promise<Map<string, { cancelRequested: boolean }>> {
  const { rows } = await pool.query<{ id: string; cancel_requested: boolean }>(
    RENEW([held.map((h) => h.id), held.map((h) => h.attempt), held.map((h) => h.jobId), leaseMs]),
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
 * attempt's log entry (`cancelled`: it ended by a cancel). `ownCredential`: the request brought
 * its caller's credential, which the write destroys.
 */
export type Terminal = Readonly<
  {
    id: string; attempt: number; jobId: string | null; answer: Answer; tokens: Tokens; frames: { bytes: number; lastSeq: number } | null;
    cancelled: boolean; end: AttemptEnd; ownCredential: boolean;
  } & Traffic
>;

/**
 * Which optional parts a batch's terminal write needs. Each part costs the statement its
 * executor setup on every call even when it writes nothing (about 50 µs of PostgreSQL's CPU for
 * these, a tenth of a one-answer statement), so a batch that needs none runs without them.
 * `metering`: debit credit and monthly spend (a deployment setting). `cleanup`: the batch holds
 * a failure (its claim is released) or a request that brought its own credential (destroyed).
 */
type SettleShape = { metering: boolean; cleanup: boolean };

const CLEANUP = `), forgotten AS (
  DELETE FROM sarsen.request_credentials k USING done d WHERE k.request_id = d.id AND k.request_id = ANY($1::text[]) RETURNING 1
), released AS (
  -- A terminal failure releases the claim: the same body afterwards is a new request.
  DELETE FROM sarsen.idempotency_claims k USING done d
   WHERE k.request_id = d.id AND k.request_id = ANY($1::text[]) AND d.outcome = 'failed' RETURNING 1
`;

const METERING = `), charged AS (
  UPDATE sarsen.credit c SET balance_micros = c.balance_micros - t.micros
    FROM (SELECT tenancy_id, sum(micros) AS micros FROM done WHERE micros > 0 GROUP BY tenancy_id) AS t
   WHERE c.tenancy_id = t.tenancy_id
  RETURNING 1
), spent AS (
  INSERT INTO sarsen.monthly_spend (scope_id, month, spent_micros)
  SELECT scope, date_trunc('month', now())::date, sum(p.micros)
    FROM done p, LATERAL (VALUES (p.api_key_id), (p.namespace_id)) AS s(scope)
   WHERE p.micros > 0 AND scope IS NOT NULL
   GROUP BY scope
  ON CONFLICT (scope_id, month) DO UPDATE SET spent_micros = monthly_spend.spent_micros + EXCLUDED.spent_micros
  RETURNING 1
`;

const settleSql = (shape: SettleShape): string => `WITH input AS (
  SELECT t.*, ${binarySlice('$6::bytea', 't.body_size', 't.ord')} AS body
    FROM unnest($1::text[], $2::int[], $3::text[], $4::int[], $5::text[], $19::int[], $7::int[], $8::text[],
                $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[], $17::bigint[], $18::int[],
                $20::boolean[], $21::text[], $22::int[], $23::text[])
      WITH ORDINALITY AS t(id, attempt, outcome, http_status, content_type, body_size, error_status, retry_after,
                           prompt, completion, total, sent, received, job_id, chunk_bytes, last_seq, reached,
                           ending, provider_status, transport_error, ord)
), cost AS (
  -- Token cost at the model's price (micro-credits per million tokens, rounded up); no price, no charge.
  -- A failure carries tokens only when it was cancelled mid-stream: what was produced is charged.
  -- A key lookup per answer (a subquery in the select list is never turned into a join).
  SELECT i.id, coalesce((
      SELECT (ceil(coalesce(i.prompt, 0) * p.prompt_micros_per_mtok / 1e6)
            + ceil(coalesce(i.completion, 0) * p.completion_micros_per_mtok / 1e6))::bigint
        FROM sarsen.requests q JOIN sarsen.prices p ON p.model = q.upstream_model
       WHERE q.id = i.id), 0) AS micros
    FROM input i
), done AS (
  UPDATE sarsen.requests q
     SET status = i.outcome, finished_at = now(), lease_owner = NULL, lease_expires_at = NULL, next_retry_at = NULL,
         prompt_tokens = i.prompt, completion_tokens = i.completion, total_tokens = i.total,
         error_status = i.error_status, retry_after = i.retry_after, response_bytes = octet_length(i.body),
         chunk_bytes = i.chunk_bytes, seq_high = greatest(q.seq_high, i.last_seq),
         cost_micros = q.cost_micros + c.micros, provider_reached = ${REACHED('q', 'i.reached')},
         attempt_log = ${appendAttempt('q', { ending: 'i.ending', status: 'i.provider_status', retryAfter: 'i.retry_after', error: 'i.transport_error' })},
         attempt_started_at = NULL
    FROM input i JOIN cost c ON c.id = i.id
   WHERE q.id = i.id AND q.id = ANY($1::text[]) AND q.attempts = i.attempt AND q.status = 'running'
  RETURNING q.id, q.tenancy_id, q.namespace_id, q.api_key_id, c.micros, i.outcome, i.http_status, i.content_type, i.body,
            i.prompt, i.completion, i.total, i.sent, i.received, i.job_id,
            -- The request's provider call, counted once, now it has settled (NULL: counted by the old rule).
            coalesce(q.provider_reached, false) AS provider_call
), answer AS (
  INSERT INTO sarsen.responses (request_id, status, content_type, body) SELECT id, http_status, content_type, body FROM done RETURNING 1
), rollup AS (
  ${addToRollup(
    ['provider_calls', 'upstream_sent_bytes', 'upstream_received_bytes', 'response_bytes'],
    `SELECT namespace_id, count(*) FILTER (WHERE provider_call) AS provider_calls, sum(sent) AS upstream_sent_bytes,
            sum(received) AS upstream_received_bytes, sum(octet_length(body)) AS response_bytes FROM done GROUP BY namespace_id`,
    '$15',
  )}
  RETURNING 1
), entry AS (
  INSERT INTO sarsen.ledger (tenancy_id, namespace_id, api_key_id, request_id, kind, amount_micros)
  SELECT tenancy_id, namespace_id, api_key_id, id, 'tokens', micros FROM done WHERE micros > 0
  RETURNING 1
), per_key AS (
  ${addToKeyHour(
    ['ledger_events', 'provider_calls', 'prompt_tokens', 'completion_tokens', 'total_tokens'],
    `SELECT namespace_id, api_key_id, count(*) FILTER (WHERE micros > 0) AS ledger_events,
            count(*) FILTER (WHERE provider_call) AS provider_calls,
            sum(prompt) AS prompt_tokens, sum(completion) AS completion_tokens, sum(total) AS total_tokens
       FROM done WHERE (outcome = 'succeeded' OR provider_call OR coalesce(prompt, completion, total) IS NOT NULL) AND api_key_id IS NOT NULL GROUP BY namespace_id, api_key_id`,
    '$15',
  )}
  RETURNING 1
${shape.cleanup ? CLEANUP : ''}${shape.metering ? METERING : ''}), removed AS (
  ${removeBackstopJobsSql(`ARRAY(SELECT job_id FROM done WHERE job_id IS NOT NULL)`)}
), notified AS (
  ${notifyEvents(`SELECT id AS request_id, 'state' AS event, outcome AS arg FROM done`, '$16')}
)
SELECT id, (SELECT count(*) FROM removed) + (SELECT count(*) FROM notified) AS side_effects FROM done`;

/** The terminal-write statement for a batch of this shape: one named statement per shape. */
const settleStatements = new Map<string, ReturnType<typeof prepared>>();
function settleStatement(shape: SettleShape): ReturnType<typeof prepared> {
  const name = `sarsen_settle_batch${shape.metering ? '_metered' : ''}${shape.cleanup ? '_cleanup' : ''}`;
  let statement = settleStatements.get(name);
  if (!statement) settleStatements.set(name, (statement = prepared(name, settleSql(shape))));
  return statement;
}

/**
 * The terminal writes of a batch of attempts in one statement (a group commit): answers,
 * tokens, token cost (ledger, and a credit debit when metering), counters, the credential
 * destroyed, a failure's claim released, a backstop job removed, and one bus event each.
 * Answers the ids written; an attempt missing from it had lost its lease, and wrote nothing.
 */
export async function settleBatch(
  pool: Pool | PoolClient,
  ts: readonly Terminal[],
  opts: { metering: boolean; origin: string; counterShard: number },
): Promise<Set<string>> {
  const col = (f: (t: Terminal) => Element) => arrayLiteral(ts.map(f));
  const bodies = binaryColumn(ts.map((t) => t.answer.body));
  const cleanup = ts.some((t) => t.ownCredential || t.answer.status === 'failed');
  const { rows } = await pool.query<{ id: string }>(
    settleStatement({ metering: opts.metering, cleanup })([
      col((t) => t.id), col((t) => t.attempt), col((t) => t.answer.status), col((t) => t.answer.httpStatus),
      col((t) => t.answer.contentType), bodies.data, col((t) => t.answer.errorStatus), col((t) => t.answer.retryAfter),
      col((t) => t.tokens.prompt), col((t) => t.tokens.completion), col((t) => t.tokens.total), col((t) => t.sentBytes),
      col((t) => t.receivedBytes), col((t) => t.jobId), opts.counterShard, opts.origin,
      col((t) => t.frames?.bytes ?? 0), col((t) => t.frames?.lastSeq ?? 0), bodies.sizes, col((t) => t.reached),
      col((t) => (t.cancelled ? 'cancelled' : t.answer.status)), col((t) => t.end.status), col((t) => t.end.error),
    ]),
  );
  return new Set(rows.map((r) => r.id));
}

async function countTraffic(c: PoolClient, id: string, t: Traffic): Promise<void> {
  await c.query(
    addToRollup(
      ['upstream_sent_bytes', 'upstream_received_bytes'],
      `SELECT namespace_id, $3::bigint AS upstream_sent_bytes, $4::bigint AS upstream_received_bytes FROM sarsen.requests WHERE id = $1`,
      '$2',
    ),
    [id, shard(), t.sentBytes, t.receivedBytes],
  );
}

/** Fenced hand-back for a later attempt: back to pending, due at `delayMs`, with its job. */
export async function scheduleRetry(pool: Pool, f: { id: string; attempt: number; delayMs: number; origin: string; end: AttemptEnd } & Traffic): Promise<boolean> {
  return withTransaction(pool, async (c) => {
    const { rows } = await c.query<{ next_retry_at: Date }>(
      `UPDATE sarsen.requests q
          SET status = 'pending', lease_owner = NULL, lease_expires_at = NULL,
              -- A fallback backend is tried next, at once; without one, the same backend after the backoff.
              next_retry_at = CASE WHEN cardinality(q.fallback_backend_ids) > 0 THEN now() ELSE ${LEASE_END('$3')} END,
              backend_id = coalesce(q.fallback_backend_ids[1], q.backend_id), fallback_backend_ids = q.fallback_backend_ids[2:],
              provider_reached = ${REACHED('q', '$4::boolean')},
              attempt_log = ${appendAttempt('q', { ending: `'retried'`, status: '$5', retryAfter: '$6', error: '$7' })}, attempt_started_at = NULL
        WHERE id = $1 AND attempts = $2 AND status = 'running'
        RETURNING next_retry_at`,
      [f.id, f.attempt, f.delayMs, f.reached, f.end.status, f.end.retryAfter, f.end.error],
    );
    const row = rows[0];
    if (!row) return false;
    await c.query(`SELECT ${enqueueSql('$1::text', '$2::timestamptz')}`, [f.id, row.next_retry_at]);
    await countTraffic(c, f.id, f);
    await c.query(`WITH n AS (${notifyEvents(`SELECT $1::text AS request_id, 'state' AS event, 'pending' AS arg`, '$2')}) SELECT count(*) FROM n`, [
      f.id,
      f.origin,
    ]);
    return true;
  });
}
