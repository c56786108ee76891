// The SQL of background responses (docs/api.md "Background responses"): the provider's response
// ids the executor records and the read a retrieve costs (deleting one record's payload is
// the retention sweep's, src/db/retention.ts sweepRecord).
import type { Pool } from './pool.ts';
import { prepared } from './pool.ts';
import { RETIRED } from './partitions.ts';
import type { RequestStatus } from './requests.ts';

type Db = Pick<Pool, 'query'>;

const RECORD_ID = prepared(
  'sarsen_record_provider_response_id',
  `INSERT INTO sarsen.provider_response_ids (namespace_id, provider_id, request_id, attempt) VALUES ($1, $2, $3, $4)
   ON CONFLICT DO NOTHING`,
);

/** Notes that an attempt's provider response has this id; committed before the attempt stores what carries it. */
export async function recordProviderResponseId(db: Db, r: { namespaceId: string; providerId: string; requestId: string; attempt: number }): Promise<void> {
  await db.query(RECORD_ID([r.namespaceId, r.providerId, r.requestId, r.attempt]));
}

export type ResponseRow = {
  id: string;
  status: RequestStatus;
  streaming: boolean;
  dialect: string;
  model: string;
  attempts: number;
  stream_first_seq: number | null;
  cancel_requested: boolean;
  expired: boolean;
  error_status: number | null;
  /** The attempt whose provider response had the id asked for; null when it was Sarsen's id. */
  named_attempt: number | null;
  response_body: Buffer | null;
  /** The stored request body: while it runs, or when asked for. */
  body: string | null;
};

// Sarsen's own response id is its request id spelled the vendor's way: `resp_` for `req_`
// (docs/api.md "Background responses"); a provider's id of the namespace is looked up first.
const OWN_ID = `CASE WHEN $1 LIKE 'resp\\_%' THEN 'req_' || substr($1, 6) ELSE $1 END`;

// One statement whatever the state: an id is Sarsen's or, failing that, a provider's of this
// namespace (its newest request, then that request's newest attempt). Rendering a succeeded
// stream reads its last frames after it (readLastFrames: they decode from the frames before them).
const READ = prepared(
  'sarsen_read_background_response',
  `WITH named AS (
     SELECT request_id, attempt FROM sarsen.provider_response_ids
      WHERE namespace_id = $2 AND provider_id = $1 AND $1 NOT LIKE 'req\\_%'
      ORDER BY request_id DESC, attempt DESC LIMIT 1
   )
   SELECT q.id, q.status, q.streaming, q.dialect, q.model, q.attempts, q.stream_first_seq, q.cancel_requested,
          q.expired OR q.id < ${RETIRED} AS expired, q.error_status, (SELECT attempt FROM named) AS named_attempt,
          r.body AS response_body,
          CASE WHEN $3 OR q.status NOT IN ('succeeded', 'failed') THEN b.body END AS body
     FROM sarsen.requests q
     LEFT JOIN sarsen.responses r ON r.request_id = q.id
     LEFT JOIN sarsen.request_bodies b ON b.request_id = q.id
    WHERE q.id = coalesce((SELECT request_id FROM named), ${OWN_ID}) AND q.namespace_id = $2`,
);

/**
 * The request a response id names in this namespace (Sarsen's id or a provider's), or null.
 * `body`: the stored request body even once it ended. (A succeeded stream's final Response is
 * in its last frames: src/db/chunks.ts readLastFrames.)
 */
export async function readResponse(db: Db, namespaceId: string, id: string, opts: { body: boolean }): Promise<ResponseRow | null> {
  const { rows } = await db.query<ResponseRow>(READ([id, namespaceId, opts.body]));
  return rows[0] ?? null;
}

export type ResponseIds = { request_id: string; background: boolean; response_ids: { id: string; attempt: number }[] };

const IDS = prepared(
  'sarsen_read_response_ids',
  `WITH target AS (
     SELECT coalesce((SELECT request_id FROM sarsen.provider_response_ids
                       WHERE namespace_id = $2 AND provider_id = $1 AND $1 NOT LIKE 'req\\_%'
                       ORDER BY request_id DESC, attempt DESC LIMIT 1), ${OWN_ID}) AS id
   )
   SELECT q.id AS request_id, CASE WHEN b.body LIKE '%"background":true%' THEN (b.body::json -> 'background')::text = 'true' ELSE false END AS background,
          coalesce((SELECT json_agg(json_build_object('id', p.provider_id, 'attempt', p.attempt) ORDER BY p.attempt, p.provider_id)
                      FROM sarsen.provider_response_ids p WHERE p.request_id = q.id AND p.namespace_id = q.namespace_id), '[]') AS response_ids
     FROM sarsen.requests q LEFT JOIN sarsen.request_bodies b ON b.request_id = q.id
    WHERE q.id = (SELECT id FROM target) AND q.namespace_id = $2 AND q.dialect = 'responses'`,
);

/** A Responses request found by Sarsen's id or a provider's: whether it is a background one, and its attempts' provider ids (the console's request page). */
export async function readResponseIds(db: Db, namespaceId: string, id: string): Promise<ResponseIds | null> {
  const { rows } = await db.query<ResponseIds>(IDS([id, namespaceId]));
  return rows[0] ?? null;
}
