// A request as readers see it: the record by id and its stream's state.
// Frames are read and written in chunks.ts. Writers are elsewhere: submissions.ts (acceptance),
// attempts.ts (claims, leases, outcomes), recovery.ts (re-dispatch).
import type { Pool } from './pool.ts';
import { prepared } from './pool.ts';
import { bytesFrom, selectBytes, type Bytes } from './columns.ts';
import type { Dialect } from '../core/dialects.ts';
import { RETIRED } from './partitions.ts';

export type { Dialect };
export type RequestStatus = 'pending' | 'running' | 'succeeded' | 'failed';

/** A stored stream frame: byte-exact, numbered per request across attempts (read back from the table, as text: see Bytes). */
export type ChunkRow = { seq: number; attempt: number; frame: Bytes };

/** A terminal answer as the routes send it: the stored body and what its status line needs. */
export type Answer = Readonly<{
  status: 'succeeded' | 'failed';
  /** The provider's status for a success; for a failure, its status (or 502 for ours). */
  httpStatus: number;
  contentType: string | null;
  body: Buffer;
  /** Set only when the failure was an HTTP answer from the provider. */
  errorStatus: number | null;
  retryAfter: string | null;
}>;

/** A large stored body, read a slice at a time (so a reader holds a slice, not the body; as text: see Bytes). */
export type BodyPages = Readonly<{ length: number; read(from: number, length: number): Promise<Bytes> }>;

/** An answer as read back for a waiter: a body of at most INLINE_BODY_BYTES at hand, a larger one in pages. */
export type StoredAnswer = Omit<Answer, 'body'> & { body: Buffer | BodyPages };

const INLINE_BODY_BYTES = 256 * 1024;

export type RecordRow = {
  id: string;
  namespace_id: string;
  status: RequestStatus;
  dialect: Dialect;
  streaming: boolean;
  /** The backend of the latest attempt (after fallbacks, the one that answered). */
  backend_id: string;
  attempts: number;
  recoveries: number;
  next_retry_at: Date | null;
  /** One entry per attempt that ended (src/db/attempt-log.ts). */
  attempt_log: Record<string, unknown>[];
  error_status: number | null;
  retry_after: string | null;
  expired: boolean;
  /** The request whose stored answer the response cache copied into this one. */
  cached_from: string | null;
  response_status: number | null;
  response_content_type: string | null;
  response_body: Buffer | null;
};

export const isTerminal = (s: RequestStatus | null | undefined): s is 'succeeded' | 'failed' => s === 'succeeded' || s === 'failed';

const READ_RECORD = prepared(
  'sarsen_read_record',
  `SELECT q.id, q.namespace_id, q.status, q.dialect, q.streaming, q.backend_id, q.attempts, q.recoveries, q.next_retry_at,
          q.attempt_log, q.error_status, q.retry_after, q.expired OR q.id < ${RETIRED} AS expired, q.cached_from,
          r.status AS response_status, r.content_type AS response_content_type, r.body AS response_body
     FROM sarsen.requests q LEFT JOIN sarsen.responses r ON r.request_id = q.id
    WHERE q.id = $1 AND q.namespace_id = $2`,
);

/** The record as GET /requests/{id} needs it, or null when the id is not this namespace's. */
export async function readRecord(pool: Pool, namespaceId: string, id: string): Promise<RecordRow | null> {
  const { rows } = await pool.query<RecordRow>(READ_RECORD([id, namespaceId]));
  return rows[0] ?? null;
}

const READ_ANSWER = prepared(
  'sarsen_read_answer',
  `SELECT q.status, q.error_status, q.retry_after, r.status AS response_status, r.content_type AS response_content_type,
          octet_length(r.body) AS length, CASE WHEN octet_length(r.body) <= $3 THEN r.body END AS body
     FROM sarsen.requests q LEFT JOIN sarsen.responses r ON r.request_id = q.id
    WHERE q.id = $1 AND q.namespace_id = $2`,
);

const READ_BODY_SLICE = prepared(
  'sarsen_read_body_slice',
  `SELECT ${selectBytes('substring(body FROM $2 FOR $3)')} AS slice FROM sarsen.responses WHERE request_id = $1`,
);

/**
 * The answer of a settled request for its waiters (null while it has not settled; undefined
 * when the id is not this namespace's). A large body is not read here: the answer carries
 * pages to read it by.
 */
export async function readAnswer(pool: Pool, namespaceId: string, id: string): Promise<StoredAnswer | null | undefined> {
  const { rows } = await pool.query<{
    status: RequestStatus; error_status: number | null; retry_after: string | null;
    response_status: number | null; response_content_type: string | null; length: number | null; body: Buffer | null;
  }>(READ_ANSWER([id, namespaceId, INLINE_BODY_BYTES]));
  const r = rows[0];
  if (!r) return undefined;
  if (!isTerminal(r.status)) return null;
  const pages: BodyPages = {
    length: r.length ?? 0,
    async read(from, length) {
      const { rows: slice } = await pool.query<{ slice: string | null }>(READ_BODY_SLICE([id, from + 1, length]));
      return bytesFrom(slice[0]?.slice ?? null) ?? Buffer.alloc(0);
    },
  };
  return {
    status: r.status,
    httpStatus: r.response_status ?? (r.status === 'failed' ? 502 : 200),
    contentType: r.response_content_type,
    body: r.body ?? (r.length ? pages : Buffer.alloc(0)),
    errorStatus: r.error_status,
    retryAfter: r.retry_after,
  };
}

export type StreamState = { status: RequestStatus; streamFirstSeq: number | null; attempts: number; seqHigh: number };

const READ_STREAM_STATE = prepared(
  'sarsen_read_stream_state',
  `SELECT status, stream_first_seq, attempts, seq_high FROM sarsen.requests WHERE id = $1`,
);

export async function readStreamState(pool: Pool, requestId: string): Promise<StreamState | null> {
  const { rows } = await pool.query<{ status: RequestStatus; stream_first_seq: number | null; attempts: number; seq_high: number }>(
    READ_STREAM_STATE([requestId]),
  );
  const r = rows[0];
  return r ? { status: r.status, streamFirstSeq: r.stream_first_seq, attempts: r.attempts, seqHigh: r.seq_high } : null;
}

/** Requests in each live state, deployment-wide, read through partial indexes (every running request holds a lease). */
export async function countLiveRequests(db: Pick<Pool, 'query'>): Promise<Record<'pending' | 'running', number>> {
  const { rows } = await db.query<{ pending: number; running: number }>(
    `SELECT (SELECT count(*) FROM sarsen.requests WHERE status = 'pending')::int AS pending,
            (SELECT count(*) FROM sarsen.requests WHERE status = 'running' AND lease_expires_at IS NOT NULL)::int AS running`,
  );
  return rows[0]!;
}

/** The traceparent a request's acceptance stored (null: none; docs/operations.md "Tracing"). Read only when tracing is on. */
export async function requestTraceParent(pool: Pool, requestId: string): Promise<string | null> {
  const { rows } = await pool.query<{ trace_parent: string | null }>('SELECT trace_parent FROM sarsen.requests WHERE id = $1', [requestId]);
  return rows[0]?.trace_parent ?? null;
}
