// A request as readers see it: the record by id and its stream's state.
// Frames are read and written in chunks.ts. Writers are elsewhere: submissions.ts (acceptance),
// attempts.ts (claims, leases, outcomes), recovery.ts (re-dispatch).
import type { Pool } from './pool.ts';
import { prepared } from './pool.ts';

export type RequestStatus = 'pending' | 'running' | 'succeeded' | 'failed';
export type Dialect = 'chat' | 'messages';

/** A stored stream frame: byte-exact, numbered per request across attempts. */
export type ChunkRow = { seq: number; attempt: number; frame: Buffer };

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

export const isTerminal = (s: RequestStatus | null | undefined): s is 'succeeded' | 'failed' => s === 'succeeded' || s === 'failed';

/** The answer of a record that settled (null while it has not). */
export function answerOf(r: RecordRow): Answer | null {
  if (!isTerminal(r.status)) return null;
  return {
    status: r.status,
    httpStatus: r.response_status ?? (r.status === 'failed' ? 502 : 200),
    contentType: r.response_content_type,
    body: r.response_body ?? Buffer.alloc(0),
    errorStatus: r.error_status,
    retryAfter: r.retry_after,
  };
}

const READ_RECORD = prepared(
  'sarsen_read_record',
  `SELECT q.id, q.namespace_id, q.status, q.dialect, q.streaming, q.attempts, q.recoveries, q.next_retry_at,
          q.error_status, q.retry_after, q.expired,
          r.status AS response_status, r.content_type AS response_content_type, r.body AS response_body
     FROM sarsen.requests q LEFT JOIN sarsen.responses r ON r.request_id = q.id
    WHERE q.id = $1 AND q.namespace_id = $2`,
);

/** The record as GET /requests/{id} needs it, or null when the id is not this namespace's. */
export async function readRecord(pool: Pool, namespaceId: string, id: string): Promise<RecordRow | null> {
  const { rows } = await pool.query<RecordRow>(READ_RECORD([id, namespaceId]));
  return rows[0] ?? null;
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
