WITH renewed AS (
  UPDATE sarsen.requests q SET lease_expires_at = now() + make_interval(secs => $4::double precision / 1000)
    FROM unnest($1::text[], $2::int[], $3::bigint[]) AS a(id, attempt, job_id)
   WHERE q.id = a.id AND q.id = ANY($1::text[]) AND q.id >= sarsen.least_id($1::text[]) AND q.attempts = a.attempt AND q.status = 'running'
  RETURNING q.id, a.job_id, q.cancel_requested
), moved AS (
  SELECT j.id FROM graphile_worker.reschedule_jobs(ARRAY(SELECT job_id FROM renewed WHERE job_id IS NOT NULL), run_at => now() + make_interval(secs => $4::double precision / 1000)) AS j
)
SELECT id, cancel_requested, (SELECT count(*) FROM moved) AS moved FROM renewed
