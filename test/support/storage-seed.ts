// A history of finished records written set-based, a day per statement, shaped as the write
// path leaves them (src/db/submissions.ts, attempts.ts, chunks.ts): request rows with ULID ids
// that sort by creation time, canonical bodies, answers, a share of them streamed with their
// frames packed a flush per row, a ledger entry each, and the hourly and all-time counters,
// the storage counters equal to the bytes held. The same statements fill the layout before
// migration 020 and after it (the tables and columns are the same). Used by the migration test
// and by bench/storage.ts.
import type pg from 'pg';
import { firstIdAt } from '../../src/core/ids.ts';

export type SeedTarget = { tenancyId: string; namespaceId: string; apiKeyIds: string[]; backendId: string };
export type SeedShape = {
  /** Bytes of each request body (about), of each whole answer, and of each stream frame. */
  bodyBytes: number;
  answerBytes: number;
  frameBytes: number;
  /** One record in `streamEvery` is streamed, with `frames` frames packed `framesPerRow` to a row. */
  streamEvery: number;
  frames: number;
  framesPerRow: number;
};
export const DEFAULT_SHAPE: SeedShape = { bodyBytes: 2048, answerBytes: 1024, frameBytes: 160, streamEvery: 5, frames: 100, framesPerRow: 10 };

const CROCKFORD = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';

/** SQL for `digits` Crockford base32 characters of the bigint expression `v`, most significant first. */
function base32(v: string, digits: number): string {
  const parts: string[] = [];
  for (let i = digits - 1; i >= 0; i--) parts.push(`substr('${CROCKFORD}', ((${v} >> ${5 * i}) & 31)::int + 1, 1)`);
  return parts.join(' || ');
}

const WORDS = 'the of and to in is that for it as was with be by on not he this are or his from at which but have an they you were her she there been one all we their has would when if so no will more can other what about into than them some could these two may then first any my now such like our over man me even most made after also did many before must through back years where much your way well down should because each just those people how too little state good very make world still own see men work long get here between both life being under never day same another know while last might us great old year off come since against go came right used take three'
  .split(' ');

// Texts of about `bytes` bytes that compress as prose does (words drawn from a vocabulary, so
// PostgreSQL's compression finds repeats, about two to one), not as one repeated string does.
// Made once per connection into a pool of 997 (a prime: record g takes text g % 997).
const TEXT = (seed: string, bytes: string) =>
  `(SELECT left(string_agg((ARRAY['${WORDS.join("','")}'])[1 + get_byte(h, i % 16) % ${WORDS.length}], ' '), ${bytes})
      FROM generate_series(0, ${bytes} / 4) AS i, LATERAL (SELECT decode(md5(${seed} || '.' || (i / 16)), 'hex') AS h) AS d)`;
const POOL = 997;
// $1 body bytes, $2 answer bytes, $3 frame bytes, $4 frames per row
const TEXTS = `
CREATE TEMP TABLE IF NOT EXISTS seed_texts AS
SELECT n, ${TEXT("n || 'b'", '$1::int')} AS body, ${TEXT("n || 'a'", '$2::int')} AS answer, f.frames, f.lengths
  FROM generate_series(0, ${POOL - 1}) AS n,
       LATERAL (SELECT string_agg(frame, '' ORDER BY k) AS frames, array_agg(octet_length(frame) ORDER BY k) AS lengths
                  FROM (SELECT k, 'data: {"choices":[{"delta":{"content":"' || ${TEXT("n || 'f' || k", '$3::int - 48')} || '"}}]}' || E'\\n\\n' AS frame
                          FROM generate_series(1, $4::int) AS k) AS fs) AS f`;

// $1 tenancy, $2 namespace, $3 keys, $4 backend, $5 count, $6 first ms, $7 span ms, $8 stream every, $9 frames, $10 frames per row
const REQUESTS = `
WITH made AS (
  SELECT g, x.ms, 'req_' || ${base32('x.ms', 10)} || ${base32('x.r1', 10)} || ${base32('x.r2', 6)} AS id, to_timestamp(x.ms / 1000.0) AS t
    FROM generate_series(1, $5::int) g,
         LATERAL (SELECT $6::bigint + (g - 1) * $7::bigint / $5::int AS ms, (random() * 1125899906842623)::bigint AS r1, (random() * 1073741823)::bigint AS r2) x
), bodies AS (
  INSERT INTO sarsen.request_bodies (request_id, body)
  SELECT m.id, '{"messages":[{"content":"' || m.id || ' ' || s.body || '","role":"user"}],"model":"gpt-bench"' || CASE WHEN m.g % $8 = 0 THEN ',"stream":true' ELSE '' END || '}'
    FROM made m JOIN seed_texts s ON s.n = m.g % ${POOL}
  RETURNING request_id, octet_length(body) AS bytes
), answers AS (
  INSERT INTO sarsen.responses (request_id, status, content_type, body)
  SELECT m.id, 200, 'application/json', convert_to('{"choices":[{"message":{"content":"' || s.answer || '"}}],"id":"' || m.id || '"}', 'UTF8')
    FROM made m JOIN seed_texts s ON s.n = (m.g + 1) % ${POOL} WHERE m.g % $8 <> 0
  RETURNING request_id, octet_length(body) AS bytes
), frames AS (
  INSERT INTO sarsen.chunks (request_id, last_seq, attempt, frames, frame_lengths)
  SELECT m.id, (r + 1) * $10::int, 1, convert_to(s.frames, 'UTF8'), s.lengths
    FROM made m, generate_series(0, $9::int / $10::int - 1) AS r, seed_texts s
   WHERE m.g % $8 = 0 AND s.n = (m.g + r) % ${POOL}
  RETURNING request_id, octet_length(frames) AS bytes
)
INSERT INTO sarsen.requests (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model,
  status, attempts, prompt_tokens, completion_tokens, total_tokens, request_bytes, response_bytes, chunk_bytes,
  seq_high, stream_first_seq, created_at, started_at, finished_at, provider_reached)
SELECT m.id, $1, $2, ($3::text[])[1 + m.g % cardinality($3::text[])], $4, 'chat', m.g % $8 = 0, 'gpt-bench', 'gpt-bench',
       'succeeded', 1, 20 + m.g % 400, 5 + m.g % 800, 25 + m.g % 400 + m.g % 800,
       b.bytes, coalesce(a.bytes, 0), coalesce(f.bytes, 0),
       CASE WHEN m.g % $8 = 0 THEN $9 ELSE 0 END, CASE WHEN m.g % $8 = 0 THEN 1 END,
       m.t, m.t + interval '3 ms', m.t + make_interval(secs => (200 + m.g % 1800) / 1000.0), true
  FROM made m
  JOIN (SELECT request_id, bytes FROM bodies) b ON b.request_id = m.id
  LEFT JOIN (SELECT request_id, bytes FROM answers) a ON a.request_id = m.id
  LEFT JOIN (SELECT request_id, sum(bytes) AS bytes FROM frames GROUP BY request_id) f ON f.request_id = m.id`;

// The ledger and counters of the records made in [$2, $3) of namespace $1.
const LEDGER = `
INSERT INTO sarsen.ledger (tenancy_id, namespace_id, api_key_id, request_id, kind, amount_micros, created_at)
SELECT q.tenancy_id, q.namespace_id, q.api_key_id, q.id, 'execution', 0, q.created_at
  FROM sarsen.requests q WHERE q.namespace_id = $1 AND q.id >= $2 AND q.id < $3 ORDER BY q.id`;
// The shard the watcher folds counters into (src/db/counters.ts).
const SHARD = '0';
const HOURLY = `
INSERT INTO sarsen.key_usage_hourly AS h (namespace_id, api_key_id, hour, shard, ledger_events, provider_calls, prompt_tokens, completion_tokens, total_tokens)
SELECT namespace_id, api_key_id, hour, shard, sum(events), sum(calls), sum(prompt), sum(completion), sum(total)
  FROM (SELECT q.namespace_id, q.api_key_id, date_trunc('hour', q.created_at) AS hour, ${SHARD} AS shard,
               1 AS events, 0 AS calls, NULL::bigint AS prompt, NULL::bigint AS completion, NULL::bigint AS total
          FROM sarsen.requests q WHERE q.namespace_id = $1 AND q.id >= $2 AND q.id < $3
        UNION ALL
        SELECT q.namespace_id, q.api_key_id, date_trunc('hour', q.finished_at), ${SHARD},
               0, 1, q.prompt_tokens, q.completion_tokens, q.total_tokens
          FROM sarsen.requests q WHERE q.namespace_id = $1 AND q.id >= $2 AND q.id < $3) AS e
 GROUP BY 1, 2, 3, 4
ON CONFLICT (namespace_id, hour, api_key_id, shard) DO UPDATE SET ledger_events = h.ledger_events + EXCLUDED.ledger_events,
  provider_calls = h.provider_calls + EXCLUDED.provider_calls, prompt_tokens = coalesce(h.prompt_tokens, 0) + EXCLUDED.prompt_tokens,
  completion_tokens = coalesce(h.completion_tokens, 0) + EXCLUDED.completion_tokens, total_tokens = coalesce(h.total_tokens, 0) + EXCLUDED.total_tokens`;
const ROLLUP = `
INSERT INTO sarsen.usage_rollup AS u (namespace_id, shard, accepted_submissions, provider_calls, upstream_sent_bytes,
  upstream_received_bytes, request_bytes, response_bytes, chunk_bytes)
SELECT q.namespace_id, ${SHARD}, count(*), count(*), sum(q.request_bytes), sum(q.response_bytes + q.chunk_bytes),
       sum(q.request_bytes), sum(q.response_bytes), sum(q.chunk_bytes)
  FROM sarsen.requests q WHERE q.namespace_id = $1 AND q.id >= $2 AND q.id < $3
 GROUP BY 1, 2
ON CONFLICT (namespace_id, shard) DO UPDATE SET accepted_submissions = u.accepted_submissions + EXCLUDED.accepted_submissions,
  provider_calls = u.provider_calls + EXCLUDED.provider_calls, upstream_sent_bytes = u.upstream_sent_bytes + EXCLUDED.upstream_sent_bytes,
  upstream_received_bytes = u.upstream_received_bytes + EXCLUDED.upstream_received_bytes, request_bytes = u.request_bytes + EXCLUDED.request_bytes,
  response_bytes = u.response_bytes + EXCLUDED.response_bytes, chunk_bytes = u.chunk_bytes + EXCLUDED.chunk_bytes`;

/**
 * `count` finished records of `target` made evenly over [fromMs, fromMs + spanMs), with their
 * ledger entries and counters, in one transaction. Answers the rows written to requests.
 */
export async function seedRecords(pool: pg.Pool, target: SeedTarget, count: number, fromMs: number, spanMs: number, shape: SeedShape = DEFAULT_SHAPE): Promise<number> {
  const c = await pool.connect();
  try {
    await c.query('BEGIN');
    await c.query(TEXTS, [shape.bodyBytes, shape.answerBytes, shape.frameBytes, shape.framesPerRow]);
    const { rowCount } = await c.query(REQUESTS, [
      target.tenancyId, target.namespaceId, target.apiKeyIds, target.backendId, count, fromMs, spanMs, shape.streamEvery, shape.frames, shape.framesPerRow,
    ]);
    const range = [target.namespaceId, firstIdAt('req', fromMs), firstIdAt('req', fromMs + spanMs)];
    for (const sql of [LEDGER, HOURLY, ROLLUP]) await c.query(sql, range);
    await c.query('COMMIT');
    return rowCount ?? 0;
  } catch (err) {
    await c.query('ROLLBACK').catch(() => undefined);
    throw err;
  } finally {
    c.release();
  }
}
