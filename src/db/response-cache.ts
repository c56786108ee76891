// The response cache's part of the submission statement (docs/api.md "Response cache"). A
// submission to a namespace with a cache carries its cache key, how old an answer it takes (0
// for no-store) and whether its own answer may be served later (not for no-store). It looks for
// the live claim of its body and for the newest succeeded request stored under its key within
// that age, whose answer has not been swept (a stream the provider ended with its own failure
// lost its key at its terminal write, src/db/attempts.ts). In flight: it attaches, as always. A
// servable answer: it becomes a request of its own, already succeeded, holding a copy of that
// answer (so it lives and is swept by its own retention), with `cached_from` naming the
// original; no claim, no job, no provider call. Settled with nothing servable (too old, or not
// to be served): it takes the claim over and runs anew. A batch with no such submission uses a
// statement without these parts.
import type { Part } from './columns.ts';

const CACHE_HIT = `source_id IS NOT NULL AND coalesce(live_status NOT IN ('pending', 'running'), true)`;

/**
 * `from` names the admitted rows (with `cache_key`, `cache_ms` and `cache_store`); `to` becomes those that go on
 * to claim an identity (with `takeover_of`: the settled request whose claim they may replace),
 * and `hits` those answered from the cache. `served` returns the requests written for hits.
 */
export function cacheLookupParts(from: string, to: string): Part[] {
  return [
    {
      name: 'probe',
      sql: `SELECT o.*,
         CASE WHEN o.cache_key IS NOT NULL THEN (
           SELECT k.request_id FROM sarsen.idempotency_claims k
            WHERE k.namespace_id = o.namespace_id AND k.identity = o.identity AND k.expires_at > now()) END AS live_id,
         CASE WHEN o.cache_key IS NOT NULL AND o.cache_ms > 0 THEN (
           SELECT q.id FROM sarsen.requests q
            WHERE q.namespace_id = o.namespace_id AND q.cache_key = o.cache_key AND q.status = 'succeeded' AND NOT q.expired
              AND q.finished_at > now() - o.cache_ms * interval '1 millisecond'
              -- Served only while its answer is stored: a swept answer is never served. A key
              -- lookup per row (a scalar subquery is never turned into a join, which would read
              -- the answers' index whole).
              AND (SELECT true FROM sarsen.responses r WHERE r.request_id = q.id) IS NOT NULL
            ORDER BY q.finished_at DESC LIMIT 1) END AS source_id
    FROM ${from} o`,
    },
    {
      name: 'decided',
      sql: `SELECT p.*, ${CACHE_HIT} AS hit, CASE WHEN p.source_id IS NULL AND s.live_status = 'succeeded' THEN p.live_id END AS takeover_of
    FROM probe p
    CROSS JOIN LATERAL (
      SELECT CASE WHEN p.live_id IS NOT NULL THEN (SELECT q.status FROM sarsen.requests q WHERE q.id = p.live_id) END AS live_status
    ) AS s`,
    },
    { name: to, sql: `SELECT * FROM decided WHERE NOT hit` },
    { name: 'hits', sql: `SELECT * FROM decided WHERE hit` },
    {
      name: 'served',
      // A repeat of a statement whose commit's answer was lost finds its request written: no copy twice.
      sql: `INSERT INTO sarsen.requests (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model,
    forwarded_headers, hops, request_bytes, response_bytes, chunk_bytes, cost_micros, status, attempts, started_at, finished_at,
    seq_high, stream_first_seq, prompt_tokens, completion_tokens, total_tokens, provider_reached, cached_from)
  SELECT h.id, h.tenancy_id, h.namespace_id, h.api_key_id, s.backend_id, h.dialect, h.streaming, h.model, h.upstream_model,
         h.headers::jsonb, h.hops, octet_length(h.body), s.response_bytes, s.chunk_bytes, 0, 'succeeded', 0, now(), now(),
         s.seq_high, s.stream_first_seq, s.prompt_tokens, s.completion_tokens, s.total_tokens, false, s.id
    FROM hits h JOIN sarsen.requests s ON s.id = h.source_id AND s.id = ANY (ARRAY(SELECT source_id FROM hits))
  ON CONFLICT (id) DO NOTHING
  RETURNING id, tenancy_id, namespace_id, api_key_id, cached_from, stream_first_seq, request_bytes, response_bytes, chunk_bytes`,
    },
    {
      name: 'served_body',
      sql: `INSERT INTO sarsen.request_bodies (request_id, body) SELECT h.id, h.body FROM hits h JOIN served v ON v.id = h.id RETURNING 1`,
    },
    {
      name: 'served_answer',
      sql: `INSERT INTO sarsen.responses (request_id, status, content_type, body)
  SELECT v.id, r.status, r.content_type, r.body
    FROM served v JOIN sarsen.responses r ON r.request_id = v.cached_from AND r.request_id = ANY (ARRAY(SELECT cached_from FROM served))
  RETURNING 1`,
    },
    {
      name: 'served_frames',
      // The frames of the attempt that answered (earlier attempts' frames are not the answer).
      sql: `INSERT INTO sarsen.chunks (request_id, last_seq, attempt, frames, frame_lengths, bytes)
  SELECT v.id, c.last_seq, c.attempt, c.frames, c.frame_lengths, c.bytes
    FROM served v JOIN sarsen.chunks c ON c.request_id = v.cached_from AND c.request_id = ANY (ARRAY(SELECT cached_from FROM served))
   WHERE c.last_seq >= v.stream_first_seq
  RETURNING 1`,
    },
    {
      name: 'served_entry',
      sql: `INSERT INTO sarsen.ledger (tenancy_id, namespace_id, api_key_id, request_id, kind, amount_micros)
  SELECT tenancy_id, namespace_id, api_key_id, id, 'cached', 0 FROM served
  RETURNING 1`,
    },
  ];
}

/** The condition under which a live claim may be replaced: it names a request settled past the cache's life. */
export const TAKEOVER = (rows: string) => `k.request_id = ANY (ARRAY(SELECT takeover_of FROM ${rows} WHERE takeover_of IS NOT NULL))`;
