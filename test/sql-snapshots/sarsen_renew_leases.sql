WITH renewed AS (
  UPDATE sarsen.requests q SET lease_expires_at = now() + make_interval(secs => $3::double precision / 1000)
    FROM unnest($1::text[], $2::int[]) AS a(id, attempt)
   WHERE q.id = a.id AND q.id = ANY($1::text[]) AND q.id >= sarsen.least_id($1::text[]) AND q.attempts = a.attempt AND q.status = 'running'
  RETURNING q.id, q.cancel_requested
)
SELECT id, cancel_requested FROM renewed
