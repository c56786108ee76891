WITH offered AS (
  SELECT t.*
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::boolean[], $8::text[], $9::text[], $10::text[], $11::int[], $12::text[], $13::bytea[], $14::bytea[], $15::text[], $16::text[], $17::text[], $18::bytea[], $19::bigint[], $20::boolean[]) WITH ORDINALITY AS t(id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model, headers, hops, body, identity, sealed, owner, fallbacks, trace_parent, cache_key, cache_ms, cache_store, ord)
), probe AS (
  SELECT o.*,
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
    FROM offered o
), decided AS (
  SELECT p.*, source_id IS NOT NULL AND coalesce(live_status NOT IN ('pending', 'running'), true) AS hit, CASE WHEN p.source_id IS NULL AND s.live_status = 'succeeded' THEN p.live_id END AS takeover_of
    FROM probe p
    CROSS JOIN LATERAL (
      SELECT CASE WHEN p.live_id IS NOT NULL THEN (SELECT q.status FROM sarsen.requests q WHERE q.id = p.live_id) END AS live_status
    ) AS s
), input AS (
  SELECT * FROM decided WHERE NOT hit
), hits AS (
  SELECT * FROM decided WHERE hit
), served AS (
  INSERT INTO sarsen.requests (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model,
    forwarded_headers, hops, request_bytes, response_bytes, chunk_bytes, cost_micros, status, attempts, started_at, finished_at,
    seq_high, stream_first_seq, prompt_tokens, completion_tokens, total_tokens, provider_reached, cached_from)
  SELECT h.id, h.tenancy_id, h.namespace_id, h.api_key_id, s.backend_id, h.dialect, h.streaming, h.model, h.upstream_model,
         h.headers::jsonb, h.hops, octet_length(h.body), s.response_bytes, s.chunk_bytes, 0, 'succeeded', 0, now(), now(),
         s.seq_high, s.stream_first_seq, s.prompt_tokens, s.completion_tokens, s.total_tokens, false, s.id
    FROM hits h JOIN sarsen.requests s ON s.id = h.source_id AND s.id = ANY (ARRAY(SELECT source_id FROM hits))
  ON CONFLICT (id) DO NOTHING
  RETURNING id, tenancy_id, namespace_id, api_key_id, cached_from, stream_first_seq, request_bytes, response_bytes, chunk_bytes
), served_body AS (
  INSERT INTO sarsen.request_bodies (request_id, body) SELECT h.id, h.body FROM hits h JOIN served v ON v.id = h.id RETURNING 1
), served_answer AS (
  INSERT INTO sarsen.responses (request_id, status, content_type, body)
  SELECT v.id, r.status, r.content_type, r.body
    FROM served v JOIN sarsen.responses r ON r.request_id = v.cached_from AND r.request_id = ANY (ARRAY(SELECT cached_from FROM served))
  RETURNING 1
), served_frames AS (
  INSERT INTO sarsen.chunks (request_id, last_seq, attempt, frames, frame_lengths, bytes)
  SELECT v.id, c.last_seq, c.attempt, c.frames, c.frame_lengths, c.bytes
    FROM served v JOIN sarsen.chunks c ON c.request_id = v.cached_from AND c.request_id = ANY (ARRAY(SELECT cached_from FROM served))
   WHERE c.last_seq >= v.stream_first_seq
  RETURNING 1
), served_entry AS (
  INSERT INTO sarsen.ledger (tenancy_id, namespace_id, api_key_id, request_id, kind, amount_micros)
  SELECT tenancy_id, namespace_id, api_key_id, id, 'cached', 0 FROM served
  RETURNING 1
), claim AS (
  INSERT INTO sarsen.idempotency_claims AS k (namespace_id, identity, request_id, expires_at)
  SELECT DISTINCT ON (namespace_id, identity) namespace_id, identity, id, now() + make_interval(secs => $21::double precision / 1000)
    FROM input ORDER BY namespace_id, identity, ord
  ON CONFLICT (namespace_id, identity) DO UPDATE SET request_id = EXCLUDED.request_id, expires_at = EXCLUDED.expires_at
   WHERE k.expires_at <= now() OR k.request_id = ANY (ARRAY(SELECT takeover_of FROM input WHERE takeover_of IS NOT NULL))
  RETURNING k.namespace_id, k.identity, k.request_id
), placed AS (
  SELECT i.*, coalesce(c.request_id, l.request_id) AS request_id, c.request_id IS NOT NULL AS claimed
    FROM input i
    LEFT JOIN claim c ON c.namespace_id = i.namespace_id AND c.identity = i.identity
    -- A key lookup per submission (a subquery in the select list is never turned into a join).
    CROSS JOIN LATERAL (
      SELECT CASE WHEN c.request_id IS NULL AND i.takeover_of IS NULL THEN (
        SELECT k.request_id FROM sarsen.idempotency_claims k
         WHERE k.namespace_id = i.namespace_id AND k.identity = i.identity AND k.expires_at > now()) END AS request_id
    ) AS l
), created AS (
  SELECT * FROM placed WHERE request_id = id AND claimed
), request AS (
  INSERT INTO sarsen.requests (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model,
    forwarded_headers, hops, request_bytes, cost_micros, status, attempts, lease_owner, lease_expires_at, started_at, stream_first_seq, attempt_started_at, fallback_backend_ids, trace_parent, cache_key)
  SELECT id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model,
         headers::jsonb, hops, octet_length(body), $22::bigint,
         CASE WHEN owner IS NULL THEN 'pending' ELSE 'running' END, CASE WHEN owner IS NULL THEN 0 ELSE 1 END,
         owner, CASE WHEN owner IS NOT NULL THEN now() + make_interval(secs => $23::double precision / 1000) END, CASE WHEN owner IS NOT NULL THEN now() END,
         CASE WHEN owner IS NOT NULL THEN 1 END, CASE WHEN owner IS NOT NULL THEN now() END,
         coalesce(string_to_array(nullif(fallbacks, ''), ','), '{}'), trace_parent, CASE WHEN cache_store THEN cache_key END
    FROM created
), body AS (
  INSERT INTO sarsen.request_bodies (request_id, body) SELECT id, body FROM created
), credential AS (
  INSERT INTO sarsen.request_credentials (request_id, sealed) SELECT id, sealed FROM created WHERE sealed IS NOT NULL
), entry AS (
  INSERT INTO sarsen.ledger (tenancy_id, namespace_id, api_key_id, request_id, kind, amount_micros)
  SELECT tenancy_id, namespace_id, api_key_id, request_id,
         CASE WHEN request_id = id THEN 'execution' ELSE 'attach' END, CASE WHEN request_id = id THEN $22::bigint ELSE 0 END
    FROM placed WHERE request_id IS NOT NULL AND (claimed OR request_id <> id) ORDER BY ord
), counted AS (
  INSERT INTO sarsen.counter_deltas (namespace_id, api_key_id, hour, accepted_submissions, request_bytes, response_bytes, chunk_bytes, cache_hits, ledger_events)
  SELECT namespace_id, CASE WHEN keyed THEN api_key_id END, CASE WHEN keyed AND api_key_id IS NOT NULL THEN date_trunc('hour', now()) END,
         nullif(accepted_submissions, 0), nullif(request_bytes, 0), nullif(response_bytes, 0), nullif(chunk_bytes, 0), nullif(cache_hits, 0), nullif(ledger_events, 0)
    FROM (SELECT namespace_id, api_key_id, true AS keyed, count(*) AS accepted_submissions, sum(request_bytes) AS request_bytes, sum(response_bytes) AS response_bytes,
            sum(chunk_bytes) AS chunk_bytes, sum(cache_hits) AS cache_hits, count(*) AS ledger_events
       FROM (SELECT namespace_id, api_key_id, CASE WHEN request_id = id THEN octet_length(body) ELSE 0 END AS request_bytes, 0 AS response_bytes, 0 AS chunk_bytes, 0 AS cache_hits
               FROM placed WHERE request_id IS NOT NULL AND (claimed OR request_id <> id)
             UNION ALL
             SELECT namespace_id, api_key_id, request_bytes, response_bytes, chunk_bytes, 1 FROM served) AS landed
      GROUP BY namespace_id, api_key_id) AS added
)
SELECT coalesce(h.id, p.request_id) AS request_id, coalesce(p.request_id = p.id, false) AS created, NULL::text AS job_id,
       CASE WHEN h.id IS NOT NULL THEN 'succeeded' WHEN p.claimed THEN 'pending' ELSE (SELECT q.status FROM sarsen.requests q WHERE q.id = p.request_id) END AS status,
       h.source_id AS cached_from,
       NULL::text AS refused,
       NULL::int AS retry_after,
       NULL AS woken
  FROM offered g
  LEFT JOIN placed p ON p.ord = g.ord
  LEFT JOIN hits h ON h.ord = g.ord
 ORDER BY g.ord
