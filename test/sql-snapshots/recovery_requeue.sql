WITH victims AS (
  SELECT * FROM unnest($1::text[], $2::int[], $3::text[]) AS v(id, attempt, ending)
), discarded AS (
  DELETE FROM sarsen.chunks k USING victims v
   WHERE k.request_id = v.id AND k.request_id = ANY($1::text[]) AND k.request_id >= sarsen.least_id($1::text[]) AND k.attempt = v.attempt
  RETURNING k.request_id, k.last_seq, coalesce(k.bytes, octet_length(k.frames)) AS bytes
), freed AS (
  SELECT request_id, sum(bytes) AS bytes, max(last_seq) AS last_seq FROM discarded GROUP BY request_id
), requeued AS (
  UPDATE sarsen.requests q
     SET status = 'pending', recoveries = q.recoveries + 1, lease_owner = NULL, lease_expires_at = NULL,
         next_retry_at = NULL, seq_high = greatest(q.seq_high, coalesce(f.last_seq, 0)),
         attempt_log = CASE WHEN q.attempt_started_at IS NULL THEN q.attempt_log ELSE q.attempt_log || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
    'attempt', q.attempts, 'started_at', q.attempt_started_at, 'ended_at', now(), 'backend_id', q.backend_id,
    'outcome', v.ending::text, 'status', NULL::int, 'retry_after', NULL::text,
    'error', NULL::text))) END, attempt_started_at = NULL
    FROM victims v LEFT JOIN freed f ON f.request_id = v.id
   WHERE q.id = v.id AND q.id = ANY($1::text[]) AND q.id >= sarsen.least_id($1::text[]) AND q.attempts = v.attempt AND q.status = 'running'
  RETURNING q.id, q.namespace_id, v.attempt, coalesce(f.bytes, 0) AS bytes
), unstored AS (
  INSERT INTO sarsen.counter_deltas (namespace_id, chunk_bytes)
  SELECT namespace_id, nullif(chunk_bytes, 0) FROM (SELECT namespace_id, -sum(bytes) AS chunk_bytes FROM requeued GROUP BY namespace_id HAVING sum(bytes) > 0) AS added
  RETURNING 1
), queued AS (
  SELECT graphile_worker.add_job('execute_request', json_build_object('request_id', id), priority => -1, job_key => id, max_attempts => 25) FROM requeued
), notified AS (
  SELECT sarsen.bus_notify($4::text::text, array_agg(ev.request_id), array_agg(CASE ev.event WHEN 'frames' THEN 'f' WHEN 'state' THEN 's' WHEN 'cancel' THEN 'c' ELSE 'x' END), array_agg(ev.arg::text)) FROM (SELECT id AS request_id, 'superseded' AS event, NULL AS arg FROM requeued) AS ev
)
SELECT id, attempt, (SELECT count(*) FROM unstored) + (SELECT count(*) FROM queued) + (SELECT count(*) FROM notified) AS side_effects
  FROM requeued
