WITH given AS (
  SELECT t.*
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::boolean[], $8::text[], $9::text[], $10::text[], $11::int[], $12::text[], $13::bytea[], $14::bytea[], $15::text[], $16::text[], $17::text[], $18::int[], $19::bigint[], $20::boolean[], $21::bytea[], $22::bigint[], $23::boolean[]) WITH ORDINALITY AS t(id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model, headers, hops, body, identity, sealed, owner, fallbacks, trace_parent, request_limit, token_limit, precounted, cache_key, cache_ms, cache_store, ord)
), limited AS (
  SELECT g.ord, g.api_key_id, g.request_limit, g.token_limit, row_number() OVER (PARTITION BY g.api_key_id ORDER BY g.ord) AS nth
    FROM given g
   WHERE (g.request_limit IS NOT NULL OR g.token_limit IS NOT NULL) AND NOT g.precounted
     -- A repeat of a statement whose commit's answer was lost: its submissions were counted then.
     -- A key lookup per row: a scalar subquery is never turned into a join, which (nested loops
     -- being off for batch statements) would read the requests' index whole.
     AND (SELECT true FROM sarsen.requests q WHERE q.id = g.id) IS NULL
), windows AS (
  INSERT INTO sarsen.key_windows AS w (api_key_id, window_start, requests, refused, last_admitted, request_limit, token_limit, tokens)
  SELECT api_key_id, date_trunc('minute', now()), fresh, asked - fresh, fresh, request_limit, token_limit, spent
    FROM (SELECT a.*, CASE WHEN a.token_limit IS NOT NULL AND a.spent >= a.token_limit THEN 0
                           WHEN a.request_limit IS NULL THEN a.asked ELSE least(a.asked, a.request_limit) END AS fresh
            FROM (SELECT l.api_key_id, count(*)::int AS asked, max(l.request_limit) AS request_limit, max(l.token_limit) AS token_limit,
                         coalesce((SELECT t.tokens FROM sarsen.key_window_tokens t
                                    WHERE t.api_key_id = l.api_key_id AND t.window_start >= date_trunc('minute', now())), 0) AS spent
                    FROM limited l GROUP BY l.api_key_id) AS a) AS f
   ORDER BY api_key_id
  ON CONFLICT (api_key_id) DO UPDATE
    SET window_start = greatest(w.window_start, EXCLUDED.window_start), requests = CASE WHEN w.window_start >= EXCLUDED.window_start THEN w.requests ELSE 0 END + CASE WHEN EXCLUDED.token_limit IS NOT NULL AND EXCLUDED.tokens >= EXCLUDED.token_limit THEN 0
         WHEN EXCLUDED.request_limit IS NULL THEN (EXCLUDED.requests + EXCLUDED.refused)
         ELSE least((EXCLUDED.requests + EXCLUDED.refused), greatest(EXCLUDED.request_limit - CASE WHEN w.window_start >= EXCLUDED.window_start THEN w.requests ELSE 0 END, 0)) END, refused = CASE WHEN w.window_start >= EXCLUDED.window_start THEN w.refused ELSE 0 END + (EXCLUDED.requests + EXCLUDED.refused) - CASE WHEN EXCLUDED.token_limit IS NOT NULL AND EXCLUDED.tokens >= EXCLUDED.token_limit THEN 0
         WHEN EXCLUDED.request_limit IS NULL THEN (EXCLUDED.requests + EXCLUDED.refused)
         ELSE least((EXCLUDED.requests + EXCLUDED.refused), greatest(EXCLUDED.request_limit - CASE WHEN w.window_start >= EXCLUDED.window_start THEN w.requests ELSE 0 END, 0)) END,
        tokens = EXCLUDED.tokens, last_admitted = CASE WHEN EXCLUDED.token_limit IS NOT NULL AND EXCLUDED.tokens >= EXCLUDED.token_limit THEN 0
         WHEN EXCLUDED.request_limit IS NULL THEN (EXCLUDED.requests + EXCLUDED.refused)
         ELSE least((EXCLUDED.requests + EXCLUDED.refused), greatest(EXCLUDED.request_limit - CASE WHEN w.window_start >= EXCLUDED.window_start THEN w.requests ELSE 0 END, 0)) END, request_limit = EXCLUDED.request_limit, token_limit = EXCLUDED.token_limit
  RETURNING w.api_key_id, w.last_admitted, w.token_limit IS NOT NULL AND w.tokens >= w.token_limit AS by_tokens,
            greatest(ceil(extract(epoch FROM w.window_start + interval '1 minute' - now())), 1)::int AS retry_after
), verdicts AS (
  SELECT l.ord, l.nth > w.last_admitted AS refused, w.by_tokens, w.retry_after FROM limited l JOIN windows w ON w.api_key_id = l.api_key_id
), offered AS (
  SELECT g.* FROM given g WHERE g.ord <> ALL (ARRAY(SELECT ord FROM verdicts WHERE refused))
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
  SELECT DISTINCT ON (namespace_id, identity) namespace_id, identity, id, now() + make_interval(secs => $24::double precision / 1000)
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
    forwarded_headers, hops, request_bytes, cost_micros, status, attempts, lease_owner, lease_expires_at, started_at, stream_first_seq, attempt_started_at, fallback_backend_ids, trace_parent, token_limited, cache_key)
  SELECT id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model,
         headers::jsonb, hops, octet_length(body), $25::bigint,
         CASE WHEN owner IS NULL THEN 'pending' ELSE 'running' END, CASE WHEN owner IS NULL THEN 0 ELSE 1 END,
         owner, CASE WHEN owner IS NOT NULL THEN now() + make_interval(secs => $26::double precision / 1000) END, CASE WHEN owner IS NOT NULL THEN now() END,
         CASE WHEN owner IS NOT NULL THEN 1 END, CASE WHEN owner IS NOT NULL THEN now() END,
         coalesce(string_to_array(nullif(fallbacks, ''), ','), '{}'), trace_parent, token_limit IS NOT NULL, CASE WHEN cache_store THEN cache_key END
    FROM created
), body AS (
  INSERT INTO sarsen.request_bodies (request_id, body) SELECT id, body FROM created
), credential AS (
  INSERT INTO sarsen.request_credentials (request_id, sealed) SELECT id, sealed FROM created WHERE sealed IS NOT NULL
), entry AS (
  INSERT INTO sarsen.ledger (tenancy_id, namespace_id, api_key_id, request_id, kind, amount_micros)
  SELECT tenancy_id, namespace_id, api_key_id, request_id,
         CASE WHEN request_id = id THEN 'execution' ELSE 'attach' END, CASE WHEN request_id = id THEN $25::bigint ELSE 0 END
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
       CASE WHEN v.refused THEN CASE WHEN v.by_tokens THEN 'tokens' ELSE 'requests' END END AS refused,
       v.retry_after AS retry_after,
       NULL AS woken
  FROM given g
  LEFT JOIN placed p ON p.ord = g.ord
  LEFT JOIN hits h ON h.ord = g.ord
  LEFT JOIN verdicts v ON v.ord = g.ord
 ORDER BY g.ord
