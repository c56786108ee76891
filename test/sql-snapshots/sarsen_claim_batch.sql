WITH claimed AS (
  UPDATE sarsen.requests q
     SET status = 'running', attempts = q.attempts + 1, lease_owner = $2::text, lease_expires_at = now() + make_interval(secs => $3::double precision / 1000),
         started_at = coalesce(q.started_at, now()), next_retry_at = NULL, stream_first_seq = q.seq_high + 1,
         attempt_started_at = now()
    FROM (SELECT DISTINCT id FROM unnest($1::text[]) AS t(id)) AS i
   WHERE q.id = i.id AND q.id = ANY($1::text[]) AND q.id >= sarsen.least_id($1::text[]) AND q.status = 'pending'
  RETURNING q.id, q.attempts, q.namespace_id, q.api_key_id, q.backend_id, q.dialect, q.streaming, q.forwarded_headers,
            q.hops, q.stream_first_seq, q.cancel_requested, q.token_limited, q.upstream_model, q.recoveries, q.trace_parent
)
SELECT c.id, c.attempts, c.namespace_id, c.dialect, c.streaming, c.forwarded_headers, c.hops, c.stream_first_seq,
       c.cancel_requested, c.token_limited, c.upstream_model, c.recoveries, c.trace_parent, b.body, k.sealed AS sealed_credential,
       bk.id AS backend_id, bk.namespace_id AS backend_namespace_id, bk.kind, bk.dialect AS backend_dialect, bk.address,
       bk.credential_source, bk.credential_sealed
  FROM claimed c JOIN sarsen.request_bodies b ON b.request_id = c.id AND b.request_id = ANY($1::text[]) AND b.request_id >= sarsen.least_id($1::text[])
  LEFT JOIN sarsen.request_credentials k ON k.request_id = c.id AND k.request_id = ANY($1::text[])
  LEFT JOIN sarsen.backends bk ON bk.id = c.backend_id
