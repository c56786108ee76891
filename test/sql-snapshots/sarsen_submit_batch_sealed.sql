WITH input AS (
  SELECT t.*
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::boolean[], $8::text[], $9::text[], $10::text[], $11::int[], $12::text[], $13::bytea[], $14::bytea[], $15::text[], $16::text[], $17::text[]) WITH ORDINALITY AS t(id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model, headers, hops, body, identity, sealed, owner, fallbacks, trace_parent, ord)
), claim AS (
  INSERT INTO sarsen.idempotency_claims AS k (namespace_id, identity, request_id, expires_at)
  SELECT DISTINCT ON (namespace_id, identity) namespace_id, identity, id, now() + make_interval(secs => $18::double precision / 1000)
    FROM input ORDER BY namespace_id, identity, ord
  ON CONFLICT (namespace_id, identity) DO UPDATE SET request_id = EXCLUDED.request_id, expires_at = EXCLUDED.expires_at
   WHERE k.expires_at <= now()
  RETURNING k.namespace_id, k.identity, k.request_id
), placed AS (
  SELECT i.*, coalesce(c.request_id, l.request_id) AS request_id, c.request_id IS NOT NULL AS claimed
    FROM input i
    LEFT JOIN claim c ON c.namespace_id = i.namespace_id AND c.identity = i.identity
    -- A key lookup per submission (a subquery in the select list is never turned into a join).
    CROSS JOIN LATERAL (
      SELECT CASE WHEN c.request_id IS NULL THEN (
        SELECT k.request_id FROM sarsen.idempotency_claims k
         WHERE k.namespace_id = i.namespace_id AND k.identity = i.identity AND k.expires_at > now()) END AS request_id
    ) AS l
), created AS (
  SELECT * FROM placed WHERE request_id = id AND claimed
), request AS (
  INSERT INTO sarsen.requests (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model,
    forwarded_headers, hops, request_bytes, cost_micros, status, attempts, lease_owner, lease_expires_at, started_at, stream_first_seq, attempt_started_at, fallback_backend_ids, trace_parent)
  SELECT id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model,
         headers::jsonb, hops, octet_length(body), $19::bigint,
         CASE WHEN owner IS NULL THEN 'pending' ELSE 'running' END, CASE WHEN owner IS NULL THEN 0 ELSE 1 END,
         owner, CASE WHEN owner IS NOT NULL THEN now() + make_interval(secs => $20::double precision / 1000) END, CASE WHEN owner IS NOT NULL THEN now() END,
         CASE WHEN owner IS NOT NULL THEN 1 END, CASE WHEN owner IS NOT NULL THEN now() END,
         coalesce(string_to_array(nullif(fallbacks, ''), ','), '{}'), trace_parent
    FROM created
), body AS (
  INSERT INTO sarsen.request_bodies (request_id, body) SELECT id, body FROM created
), credential AS (
  INSERT INTO sarsen.request_credentials (request_id, sealed) SELECT id, sealed FROM created WHERE sealed IS NOT NULL
), job AS (
  INSERT INTO graphile_worker._private_jobs (task_id, payload, run_at, max_attempts, key)
    SELECT (SELECT id FROM graphile_worker._private_tasks WHERE identifier = 'execute_request'), json_build_object('request_id', j.id), j.run_at, 25, j.id FROM (SELECT id, now() AS run_at FROM created WHERE owner IS NULL) AS j
    RETURNING key, id
), entry AS (
  INSERT INTO sarsen.ledger (tenancy_id, namespace_id, api_key_id, request_id, kind, amount_micros)
  SELECT tenancy_id, namespace_id, api_key_id, request_id,
         CASE WHEN request_id = id THEN 'execution' ELSE 'attach' END, CASE WHEN request_id = id THEN $19::bigint ELSE 0 END
    FROM placed WHERE request_id IS NOT NULL AND (claimed OR request_id <> id) ORDER BY ord
), counted AS (
  INSERT INTO sarsen.counter_deltas (namespace_id, api_key_id, hour, accepted_submissions, request_bytes, ledger_events)
  SELECT namespace_id, CASE WHEN keyed THEN api_key_id END, CASE WHEN keyed AND api_key_id IS NOT NULL THEN date_trunc('hour', now()) END,
         nullif(accepted_submissions, 0), nullif(request_bytes, 0), nullif(ledger_events, 0)
    FROM (SELECT namespace_id, api_key_id, true AS keyed, count(*) AS accepted_submissions,
            coalesce(sum(octet_length(body)) FILTER (WHERE request_id = id), 0) AS request_bytes, count(*) AS ledger_events
       FROM placed WHERE request_id IS NOT NULL AND (claimed OR request_id <> id) GROUP BY namespace_id, api_key_id) AS added
)
SELECT p.request_id, p.request_id = p.id AS created, j.id::text AS job_id,
       -- A request this batch created is reported pending (docs/durability.md "Request states":
       -- accepted is pending), even when this process claimed it in the same statement and it
       -- is running already.
       -- is running already. (A submission lands on a request this batch created exactly when it
       -- lands on a claim this batch took.)
       CASE WHEN p.claimed THEN 'pending' ELSE (SELECT q.status FROM sarsen.requests q WHERE q.id = p.request_id) END AS status,
       (SELECT sarsen.wake_executors(count(*)) FROM (SELECT 1 FROM created WHERE owner IS NULL) AS due HAVING count(*) > 0) AS woken
  FROM placed p
  LEFT JOIN job j ON j.key = p.request_id AND p.request_id = p.id
 ORDER BY p.ord
