// All SQL of the request lifecycle: submission (claim + row + job in one transaction), the
// fenced writes of an attempt, and reading a record back.
import type { Pool, PoolClient } from './pool.ts';
import { withTransaction } from './pool.ts';

export type RequestStatus = 'pending' | 'running' | 'succeeded' | 'failed';
export type Dialect = 'chat' | 'messages';

const ROLLUP_SHARDS = 16;
const shard = () => Math.floor(Math.random() * ROLLUP_SHARDS);

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
}>;

export type Submitted = { requestId: string; attached: boolean; status: RequestStatus };

const NOTIFY = `pg_notify('sarsen_events', json_build_object('k', 'req:' || $1::text, 's', $2::text)::text)`;

async function countSubmission(c: PoolClient, namespaceId: string): Promise<void> {
  await c.query(
    `INSERT INTO sarsen.usage_rollup (namespace_id, shard, accepted_submissions) VALUES ($1, $2, 1)
     ON CONFLICT (namespace_id, shard) DO UPDATE SET accepted_submissions = usage_rollup.accepted_submissions + 1`,
    [namespaceId, shard()],
  );
}

/**
 * One transaction: the idempotency claim (or an attach to the live claim's request), the
 * request row and body, the rollup counter and the graphile-worker job. Concurrent identical
 * submissions serialise on the claim's primary key, so exactly one of them creates the row.
 */
export async function submitRequest(pool: Pool, r: NewRequest): Promise<Submitted> {
  for (;;) {
    const result = await withTransaction(pool, async (c): Promise<Submitted | null> => {
      const claim = await c.query(
        `INSERT INTO sarsen.idempotency_claims (namespace_id, identity, request_id, expires_at)
         VALUES ($1, $2, $3, now() + make_interval(secs => $4::double precision / 1000))
         ON CONFLICT (namespace_id, identity) DO UPDATE
           SET request_id = EXCLUDED.request_id, expires_at = EXCLUDED.expires_at
           WHERE idempotency_claims.expires_at <= now()
         RETURNING request_id`,
        [r.namespaceId, r.identity, r.id, r.windowMs],
      );
      if (claim.rowCount === 0) {
        const live = await c.query<{ id: string; status: RequestStatus }>(
          `SELECT q.id, q.status FROM sarsen.idempotency_claims k JOIN sarsen.requests q ON q.id = k.request_id
           WHERE k.namespace_id = $1 AND k.identity = $2`,
          [r.namespaceId, r.identity],
        );
        const row = live.rows[0];
        if (!row) return null; // released between the two statements: claim afresh
        await countSubmission(c, r.namespaceId);
        return { requestId: row.id, attached: true, status: row.status };
      }
      await c.query(
        `INSERT INTO sarsen.requests (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming,
           model, upstream_model, forwarded_headers, hops, request_bytes)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, octet_length($12::text))`,
        [r.id, r.tenancyId, r.namespaceId, r.apiKeyId, r.backendId, r.dialect, r.streaming, r.model, r.upstreamModel,
          JSON.stringify(r.forwardedHeaders), r.hops, r.body],
      );
      await c.query(`INSERT INTO sarsen.request_bodies (request_id, body) VALUES ($1, $2)`, [r.id, r.body]);
      await countSubmission(c, r.namespaceId);
      await c.query(
        `SELECT graphile_worker.add_job('execute_request', json_build_object('request_id', $1::text), job_key => $1::text, max_attempts => 25)`,
        [r.id],
      );
      return { requestId: r.id, attached: false, status: 'pending' };
    });
    if (result) return result;
  }
}

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
       INSERT INTO sarsen.usage_rollup (namespace_id, shard, provider_calls)
       SELECT namespace_id, $4, 1 FROM claimed WHERE attempts = 1
       ON CONFLICT (namespace_id, shard) DO UPDATE SET provider_calls = usage_rollup.provider_calls + 1
     )
     SELECT c.*, b.body FROM claimed c JOIN sarsen.request_bodies b ON b.request_id = c.id`,
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

/** Fenced terminal success. False: the attempt had lost its lease; nothing was written. */
export async function finishSucceeded(
  pool: Pool,
  f: { id: string; attempt: number; status: number; contentType: string | null; body: Buffer; tokens: Tokens } & Traffic,
): Promise<boolean> {
  return withTransaction(pool, async (c) => {
    const { rowCount } = await c.query(
      `UPDATE sarsen.requests
          SET status = 'succeeded', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
              prompt_tokens = $3, completion_tokens = $4, total_tokens = $5, response_bytes = $6
        WHERE id = $1 AND attempts = $2 AND status = 'running'`,
      [f.id, f.attempt, f.tokens.prompt, f.tokens.completion, f.tokens.total, f.body.length],
    );
    if (rowCount !== 1) return false;
    await c.query(`INSERT INTO sarsen.responses (request_id, status, content_type, body) VALUES ($1, $2, $3, $4)`, [
      f.id, f.status, f.contentType, f.body,
    ]);
    await countTraffic(c, f.id, f);
    await c.query(`SELECT ${NOTIFY}`, [f.id, 'succeeded']);
    return true;
  });
}

/**
 * Fenced terminal failure: the stored error body, the provider's status and retry-after when
 * the failure was an HTTP answer. Releases the idempotency claim in the same transaction.
 */
export async function finishFailed(
  pool: Pool,
  f: { id: string; attempt: number; errorStatus: number | null; retryAfter: string | null; body: Buffer } & Traffic,
): Promise<boolean> {
  return withTransaction(pool, async (c) => {
    const { rowCount } = await c.query(
      `UPDATE sarsen.requests
          SET status = 'failed', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
              next_retry_at = NULL, error_status = $3, retry_after = $4, response_bytes = $5
        WHERE id = $1 AND attempts = $2 AND status = 'running'`,
      [f.id, f.attempt, f.errorStatus, f.retryAfter, f.body.length],
    );
    if (rowCount !== 1) return false;
    await c.query(`INSERT INTO sarsen.responses (request_id, status, content_type, body) VALUES ($1, $2, 'application/json', $3)`, [
      f.id, f.errorStatus ?? 502, f.body,
    ]);
    await c.query(`DELETE FROM sarsen.idempotency_claims WHERE request_id = $1`, [f.id]);
    await countTraffic(c, f.id, f);
    await c.query(`SELECT ${NOTIFY}`, [f.id, 'failed']);
    return true;
  });
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
      `SELECT graphile_worker.add_job('execute_request', json_build_object('request_id', $1::text),
         run_at => $2::timestamptz, job_key => $1::text, max_attempts => 25)`,
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
       RETURNING q.id
     ), notified AS (
       SELECT pg_notify('sarsen_events', json_build_object('k', 'chunks', 'r', json_agg(json_build_array(request_id, seq)))::text)
         FROM (SELECT request_id, seq, (row_number() OVER ()) / ${NOTIFY_GROUP} AS grp FROM per_request) g
        GROUP BY grp
     )
     SELECT p.request_id, p.seq, (SELECT count(*) FROM notified) AS notes, (SELECT count(*) FROM bumped) AS bumped
       FROM per_request p`,
    [frames.map((f) => f.requestId), frames.map((f) => f.attempt), frames.map((f) => f.seq), frames.map((f) => f.frame)],
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
