// SQL of an attempt's life (claim, lease, fenced outcomes, stream frames) and of reading a
// record back. Submission is in submissions.ts.
import type { Pool, PoolClient } from './pool.ts';
import { withTransaction } from './pool.ts';

export type RequestStatus = 'pending' | 'running' | 'succeeded' | 'failed';
export type Dialect = 'chat' | 'messages';

import { shard, KEY_SHARDS } from './submissions.ts';
import { enqueueSql } from './jobs.ts';

const NOTIFY = `pg_notify('sarsen_events', json_build_object('k', 'req:' || $1::text, 's', $2::text)::text)`;

export type ClaimedAttempt = {
  id: string;
  attempt: number;
  namespaceId: string;
  backendId: string;
  dialect: Dialect;
  streaming: boolean;
  forwardedHeaders: [string, string][];
  hops: number;
  body: string;
  /** The sequence number this attempt's first stream frame takes. */
  firstSeq: number;
  /** The caller's own provider credential, sealed (caller-credential backends only). */
  sealedCredential: Buffer | null;
};

/** Takes a pending request for this worker: the attempt number it returns fences every later write. */
export async function claimAttempt(pool: Pool, id: string, owner: string, leaseMs: number): Promise<ClaimedAttempt | null> {
  const { rows } = await pool.query(
    `WITH claimed AS (
       UPDATE sarsen.requests
          SET status = 'running', attempts = attempts + 1, lease_owner = $2,
              lease_expires_at = now() + make_interval(secs => $3::double precision / 1000),
              started_at = coalesce(started_at, now()), next_retry_at = NULL, stream_first_seq = seq_high + 1
        WHERE id = $1 AND status = 'pending'
        RETURNING id, attempts, namespace_id, backend_id, dialect, streaming, forwarded_headers, hops, stream_first_seq
     ), counted AS (
       -- The first attempt is when a submission reaches a provider (SPEC.md Usage rule 2).
       INSERT INTO sarsen.usage_rollup (namespace_id, shard, provider_calls)
       SELECT namespace_id, $4, 1 FROM claimed WHERE attempts = 1
       ON CONFLICT (namespace_id, shard) DO UPDATE SET provider_calls = usage_rollup.provider_calls + 1
       RETURNING 1
     ), per_key AS (
       INSERT INTO sarsen.key_usage_hourly (namespace_id, api_key_id, hour, shard, provider_calls)
       SELECT q.namespace_id, q.api_key_id, date_trunc('hour', now()), $4::int % ${KEY_SHARDS}, 1
         FROM claimed c JOIN sarsen.requests q ON q.id = c.id WHERE c.attempts = 1 AND q.api_key_id IS NOT NULL
       ON CONFLICT (namespace_id, hour, api_key_id, shard) DO UPDATE SET provider_calls = key_usage_hourly.provider_calls + 1
       RETURNING 1
     )
     SELECT c.*, b.body, k.sealed AS sealed_credential, (SELECT count(*) FROM counted) + (SELECT count(*) FROM per_key) AS counted
       FROM claimed c JOIN sarsen.request_bodies b ON b.request_id = c.id
       LEFT JOIN sarsen.request_credentials k ON k.request_id = c.id`,
    [id, owner, leaseMs, shard()],
  );
  const row = rows[0];
  if (!row) return null;
  return {
    id: row.id,
    attempt: row.attempts,
    namespaceId: row.namespace_id,
    backendId: row.backend_id,
    dialect: row.dialect,
    streaming: row.streaming,
    forwardedHeaders: row.forwarded_headers,
    hops: row.hops,
    body: row.body,
    firstSeq: row.stream_first_seq,
    sealedCredential: row.sealed_credential,
  };
}

/** Renews the lease; false means this attempt no longer owns the request. */
export async function renewLease(pool: Pool, id: string, attempt: number, leaseMs: number): Promise<boolean> {
  const { rowCount } = await pool.query(
    `UPDATE sarsen.requests SET lease_expires_at = now() + make_interval(secs => $3::double precision / 1000)
      WHERE id = $1 AND attempts = $2 AND status = 'running'`,
    [id, attempt, leaseMs],
  );
  return rowCount === 1;
}

export type Tokens = { prompt: number | null; completion: number | null; total: number | null };
type Traffic = { sentBytes: number; receivedBytes: number };

async function countTraffic(c: PoolClient, id: string, t: Traffic): Promise<void> {
  await c.query(
    `INSERT INTO sarsen.usage_rollup (namespace_id, shard, upstream_sent_bytes, upstream_received_bytes)
     SELECT namespace_id, $2, $3, $4 FROM sarsen.requests WHERE id = $1
     ON CONFLICT (namespace_id, shard) DO UPDATE
       SET upstream_sent_bytes = usage_rollup.upstream_sent_bytes + EXCLUDED.upstream_sent_bytes,
           upstream_received_bytes = usage_rollup.upstream_received_bytes + EXCLUDED.upstream_received_bytes`,
    [id, shard(), t.sentBytes, t.receivedBytes],
  );
}

// Adds a nullable count to a nullable sum: NULL stays NULL until something reports a number.
const addKnown = (col: string) =>
  `${col} = CASE WHEN EXCLUDED.${col} IS NULL THEN key_usage_hourly.${col} ELSE coalesce(key_usage_hourly.${col}, 0) + EXCLUDED.${col} END`;

const SUCCEED = `
WITH cost AS (
  -- Token cost at the model's price (micro-credits per million tokens, rounded up); no price, no charge.
  SELECT coalesce((
    SELECT (ceil(coalesce($3::bigint, 0) * p.prompt_micros_per_mtok / 1e6)
          + ceil(coalesce($4::bigint, 0) * p.completion_micros_per_mtok / 1e6))::bigint
      FROM sarsen.requests q JOIN sarsen.prices p ON p.model = q.upstream_model WHERE q.id = $1), 0) AS micros
), done AS (
  UPDATE sarsen.requests q
     SET status = 'succeeded', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
         prompt_tokens = $3, completion_tokens = $4, total_tokens = $5, response_bytes = $6,
         cost_micros = q.cost_micros + (SELECT micros FROM cost)
   WHERE q.id = $1 AND q.attempts = $2 AND q.status = 'running'
  RETURNING q.tenancy_id, q.namespace_id, q.api_key_id, (SELECT micros FROM cost) AS micros
), answer AS (
  INSERT INTO sarsen.responses (request_id, status, content_type, body) SELECT $1, $7, $8, $9 FROM done RETURNING 1
), forgotten AS (
  DELETE FROM sarsen.request_credentials WHERE request_id = $1 AND EXISTS (SELECT 1 FROM done) RETURNING 1
), rollup AS (
  INSERT INTO sarsen.usage_rollup (namespace_id, shard, upstream_sent_bytes, upstream_received_bytes, response_bytes)
  SELECT namespace_id, $10, $11, $12, $6 FROM done
  ON CONFLICT (namespace_id, shard) DO UPDATE
    SET upstream_sent_bytes = usage_rollup.upstream_sent_bytes + EXCLUDED.upstream_sent_bytes,
        upstream_received_bytes = usage_rollup.upstream_received_bytes + EXCLUDED.upstream_received_bytes,
        response_bytes = usage_rollup.response_bytes + EXCLUDED.response_bytes
  RETURNING 1
), entry AS (
  INSERT INTO sarsen.ledger (tenancy_id, namespace_id, api_key_id, request_id, kind, amount_micros)
  SELECT tenancy_id, namespace_id, api_key_id, $1, 'tokens', micros FROM done WHERE micros > 0
  RETURNING 1
), per_key AS (
  INSERT INTO sarsen.key_usage_hourly (namespace_id, api_key_id, hour, shard, ledger_events, prompt_tokens, completion_tokens, total_tokens)
  SELECT namespace_id, api_key_id, date_trunc('hour', now()), $10::int % ${KEY_SHARDS}, (SELECT count(*) FROM entry), $3, $4, $5 FROM done
   WHERE api_key_id IS NOT NULL
  ON CONFLICT (namespace_id, hour, api_key_id, shard) DO UPDATE
    SET ledger_events = key_usage_hourly.ledger_events + EXCLUDED.ledger_events,
        ${addKnown('prompt_tokens')}, ${addKnown('completion_tokens')}, ${addKnown('total_tokens')}
  RETURNING 1
), charged AS (
  UPDATE sarsen.credit c SET balance_micros = c.balance_micros - d.micros
    FROM done d WHERE $13 AND d.micros > 0 AND c.tenancy_id = d.tenancy_id
  RETURNING 1
), spent AS (
  INSERT INTO sarsen.monthly_spend (scope_id, month, spent_micros)
  SELECT scope, date_trunc('month', now())::date, d.micros
    FROM done d, LATERAL (VALUES (d.api_key_id), (d.namespace_id)) AS s(scope)
   WHERE $13 AND d.micros > 0 AND scope IS NOT NULL
  ON CONFLICT (scope_id, month) DO UPDATE SET spent_micros = monthly_spend.spent_micros + EXCLUDED.spent_micros
  RETURNING 1
), notified AS (
  SELECT pg_notify('sarsen_events', json_build_object('k', 'req:' || $1::text, 's', 'succeeded')::text) FROM done
)
SELECT (SELECT count(*) FROM done) AS done,
       (SELECT count(*) FROM answer) + (SELECT count(*) FROM rollup) + (SELECT count(*) FROM per_key)
         + (SELECT count(*) FROM charged) + (SELECT count(*) FROM spent) + (SELECT count(*) FROM notified)
         + (SELECT count(*) FROM forgotten) AS writes`;

/**
 * Fenced terminal success, in one statement: the answer, tokens, token cost (ledger, and a
 * credit debit when metering), counters, and the bus event. False: the attempt had lost its
 * lease; nothing was written.
 */
export async function finishSucceeded(
  pool: Pool,
  f: { id: string; attempt: number; status: number; contentType: string | null; body: Buffer; tokens: Tokens; metering: boolean } & Traffic,
): Promise<boolean> {
  const { rows } = await pool.query<{ done: number }>(SUCCEED, [
    f.id, f.attempt, f.tokens.prompt, f.tokens.completion, f.tokens.total, f.body.length,
    f.status, f.contentType, f.body, shard(), f.sentBytes, f.receivedBytes, f.metering,
  ]);
  return rows[0]!.done === 1;
}

const FAIL = `
WITH done AS (
  UPDATE sarsen.requests
     SET status = 'failed', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
         next_retry_at = NULL, error_status = $3, retry_after = $4, response_bytes = octet_length($5::bytea)
   WHERE id = $1 AND attempts = $2 AND status = 'running'
  RETURNING namespace_id
), answer AS (
  INSERT INTO sarsen.responses (request_id, status, content_type, body)
  SELECT $1, coalesce($3, 502), 'application/json', $5 FROM done RETURNING 1
), forgotten AS (
  DELETE FROM sarsen.request_credentials WHERE request_id = $1 AND EXISTS (SELECT 1 FROM done) RETURNING 1
), released AS (
  -- A terminal failure releases the claim: the same body afterwards is a new request.
  DELETE FROM sarsen.idempotency_claims WHERE request_id = $1 AND EXISTS (SELECT 1 FROM done) RETURNING 1
), rollup AS (
  INSERT INTO sarsen.usage_rollup (namespace_id, shard, upstream_sent_bytes, upstream_received_bytes, response_bytes)
  SELECT namespace_id, $6, $7, $8, octet_length($5::bytea) FROM done
  ON CONFLICT (namespace_id, shard) DO UPDATE
    SET upstream_sent_bytes = usage_rollup.upstream_sent_bytes + EXCLUDED.upstream_sent_bytes,
        upstream_received_bytes = usage_rollup.upstream_received_bytes + EXCLUDED.upstream_received_bytes,
        response_bytes = usage_rollup.response_bytes + EXCLUDED.response_bytes
  RETURNING 1
), notified AS (
  SELECT pg_notify('sarsen_events', json_build_object('k', 'req:' || $1::text, 's', 'failed')::text) FROM done
)
SELECT (SELECT count(*) FROM done) AS done,
       (SELECT count(*) FROM answer) + (SELECT count(*) FROM released) + (SELECT count(*) FROM rollup)
         + (SELECT count(*) FROM notified) + (SELECT count(*) FROM forgotten) AS writes`;

/**
 * Fenced terminal failure: the stored error body, the provider's status and retry-after when
 * the failure was an HTTP answer, and the idempotency claim released, all in one statement.
 */
export async function finishFailed(
  pool: Pool,
  f: { id: string; attempt: number; errorStatus: number | null; retryAfter: string | null; body: Buffer } & Traffic,
): Promise<boolean> {
  const { rows } = await pool.query<{ done: number }>(FAIL, [
    f.id, f.attempt, f.errorStatus, f.retryAfter, f.body, shard(), f.sentBytes, f.receivedBytes,
  ]);
  return rows[0]!.done === 1;
}

/** Fenced hand-back for a later attempt: back to pending, due at `delayMs`, with its job. */
export async function scheduleRetry(pool: Pool, f: { id: string; attempt: number; delayMs: number } & Traffic): Promise<boolean> {
  return withTransaction(pool, async (c) => {
    const { rows } = await c.query<{ next_retry_at: Date }>(
      `UPDATE sarsen.requests
          SET status = 'pending', lease_owner = NULL, lease_expires_at = NULL,
              next_retry_at = now() + make_interval(secs => $3::double precision / 1000)
        WHERE id = $1 AND attempts = $2 AND status = 'running'
        RETURNING next_retry_at`,
      [f.id, f.attempt, f.delayMs],
    );
    const row = rows[0];
    if (!row) return false;
    await c.query(
      `SELECT ${enqueueSql('$1::text', '$2::timestamptz')}`,
      [f.id, row.next_retry_at],
    );
    await countTraffic(c, f.id, f);
    await c.query(`SELECT ${NOTIFY}`, [f.id, 'pending']);
    return true;
  });
}

export type RecordRow = {
  id: string;
  namespace_id: string;
  status: RequestStatus;
  dialect: Dialect;
  streaming: boolean;
  attempts: number;
  recoveries: number;
  next_retry_at: Date | null;
  error_status: number | null;
  retry_after: string | null;
  expired: boolean;
  response_status: number | null;
  response_content_type: string | null;
  response_body: Buffer | null;
};

/** The record as GET /requests/{id} needs it, or null when the id is not this namespace's. */
export async function readRecord(pool: Pool, namespaceId: string, id: string): Promise<RecordRow | null> {
  const { rows } = await pool.query<RecordRow>(
    `SELECT q.id, q.namespace_id, q.status, q.dialect, q.streaming, q.attempts, q.recoveries, q.next_retry_at,
            q.error_status, q.retry_after, q.expired,
            r.status AS response_status, r.content_type AS response_content_type, r.body AS response_body
       FROM sarsen.requests q LEFT JOIN sarsen.responses r ON r.request_id = q.id
      WHERE q.id = $1 AND q.namespace_id = $2`,
    [id, namespaceId],
  );
  return rows[0] ?? null;
}

/** The cheap read a waiter polls: status only. */
export async function readStatus(pool: Pool, id: string): Promise<RequestStatus | null> {
  const { rows } = await pool.query<{ status: RequestStatus }>(`SELECT status FROM sarsen.requests WHERE id = $1`, [id]);
  return rows[0]?.status ?? null;
}

export type FrameRow = { requestId: string; attempt: number; seq: number; frame: Buffer };

// request ids are ~30 characters: 120 [id, seq] pairs keep a NOTIFY payload well under 8000 bytes.
const NOTIFY_GROUP = 120;

/**
 * Group commit of stream frames from every live stream of this process: one statement stores
 * the frames whose attempt still holds its request (the fence), advances the request's byte
 * count and sequence high-water mark, and NOTIFYs the newest sequence per request in batches.
 * Answers the newest stored sequence per request; a request missing from the answer was
 * fenced out.
 */
export async function storeFrames(pool: Pool, frames: readonly FrameRow[]): Promise<Map<string, number>> {
  const { rows } = await pool.query<{ request_id: string; seq: number }>(
    `WITH input AS (
       SELECT * FROM unnest($1::text[], $2::int[], $3::int[], $4::bytea[]) AS t(request_id, attempt, seq, frame)
     ), fenced AS (
       -- Locked, so a recovery cannot slip in between this check and the insert.
       SELECT i.* FROM input i
         JOIN sarsen.requests q ON q.id = i.request_id AND q.attempts = i.attempt AND q.status = 'running'
          FOR UPDATE OF q
     ), ins AS (
       INSERT INTO sarsen.chunks (request_id, seq, attempt, frame)
       SELECT request_id, seq, attempt, frame FROM fenced
       RETURNING request_id, seq, octet_length(frame) AS bytes
     ), per_request AS (
       SELECT request_id, max(seq) AS seq, sum(bytes) AS bytes FROM ins GROUP BY request_id
     ), bumped AS (
       UPDATE sarsen.requests q
          SET chunk_bytes = q.chunk_bytes + p.bytes, seq_high = greatest(q.seq_high, p.seq)
         FROM per_request p WHERE q.id = p.request_id
       RETURNING q.id, q.namespace_id, p.bytes
     ), stored AS (
       INSERT INTO sarsen.usage_rollup (namespace_id, shard, chunk_bytes)
       SELECT namespace_id, $5, sum(bytes) FROM bumped GROUP BY namespace_id
       ON CONFLICT (namespace_id, shard) DO UPDATE SET chunk_bytes = usage_rollup.chunk_bytes + EXCLUDED.chunk_bytes
       RETURNING 1
     ), notified AS (
       SELECT pg_notify('sarsen_events', json_build_object('k', 'chunks', 'r', json_agg(json_build_array(request_id, seq)))::text)
         FROM (SELECT request_id, seq, (row_number() OVER ()) / ${NOTIFY_GROUP} AS grp FROM per_request) g
        GROUP BY grp
     )
     SELECT p.request_id, p.seq, (SELECT count(*) FROM notified) AS notes, (SELECT count(*) FROM stored) AS stored
       FROM per_request p`,
    [frames.map((f) => f.requestId), frames.map((f) => f.attempt), frames.map((f) => f.seq), frames.map((f) => f.frame), shard()],
  );
  return new Map(rows.map((r) => [r.request_id, r.seq]));
}

export type ChunkRow = { seq: number; attempt: number; frame: Buffer };

/** Stored frames after `afterSeq`, in order, at most `limit`. */
export async function readFrames(pool: Pool, requestId: string, afterSeq: number, limit: number): Promise<ChunkRow[]> {
  const { rows } = await pool.query<ChunkRow>(
    `SELECT seq, attempt, frame FROM sarsen.chunks WHERE request_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`,
    [requestId, afterSeq, limit],
  );
  return rows;
}

export type StreamState = { status: RequestStatus; streamFirstSeq: number | null; attempts: number; seqHigh: number };

export async function readStreamState(pool: Pool, requestId: string): Promise<StreamState | null> {
  const { rows } = await pool.query<{ status: RequestStatus; stream_first_seq: number | null; attempts: number; seq_high: number }>(
    `SELECT status, stream_first_seq, attempts, seq_high FROM sarsen.requests WHERE id = $1`,
    [requestId],
  );
  const r = rows[0];
  return r ? { status: r.status, streamFirstSeq: r.stream_first_seq, attempts: r.attempts, seqHigh: r.seq_high } : null;
}

/** Whether frame `seq` of the request is still stored (frames of a discarded attempt are not). */
export async function frameExists(pool: Pool, requestId: string, seq: number): Promise<boolean> {
  const { rowCount } = await pool.query(`SELECT 1 FROM sarsen.chunks WHERE request_id = $1 AND seq = $2`, [requestId, seq]);
  return rowCount === 1;
}
