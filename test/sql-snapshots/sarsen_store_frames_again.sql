WITH input AS (
  SELECT t.*, CASE WHEN t.frames_size >= 0 THEN substring($7::bytea FROM (sum(greatest(t.frames_size, 0)) OVER (ORDER BY t.ord) - t.frames_size + 1)::int FOR t.frames_size) END AS frames
    FROM unnest($1::text[], $2::int[], $3::int[], $4::int[], $5::text[], $6::int[]) WITH ORDINALITY AS t(request_id, attempt, last_seq, frames_size, lengths, bytes, ord)
), fenced AS (
  SELECT q.id, q.attempts AS attempt, q.namespace_id FROM sarsen.requests q
    JOIN (SELECT DISTINCT request_id, attempt FROM input) AS i ON q.id = i.request_id AND q.attempts = i.attempt
   WHERE q.id = ANY($1::text[]) AND q.id >= sarsen.least_id($1::text[]) AND q.status = 'running'
     FOR SHARE OF q
), found AS MATERIALIZED (
  SELECT i.request_id, i.attempt, i.last_seq, i.frames, i.lengths, i.bytes,
          (SELECT k.attempt = i.attempt AND k.frames = i.frames FROM sarsen.chunks k
            WHERE k.request_id = i.request_id AND k.last_seq = i.last_seq AND k.request_id >= sarsen.least_id($1::text[])) AS stored
     FROM input i JOIN fenced f ON f.id = i.request_id AND f.attempt = i.attempt
), inserted AS (
  INSERT INTO sarsen.chunks (request_id, last_seq, attempt, frames, frame_lengths, bytes)
  SELECT request_id, last_seq, attempt, frames, lengths::int[], bytes FROM found WHERE stored IS NULL
  RETURNING request_id, attempt, last_seq, bytes
), ins AS (
  SELECT * FROM inserted
  UNION ALL
  SELECT request_id, attempt, last_seq, 0 FROM found WHERE stored
), per_request AS (
  SELECT request_id, attempt, max(last_seq) AS seq, sum(bytes) AS bytes FROM ins GROUP BY request_id, attempt
), stored AS (
  INSERT INTO sarsen.counter_deltas (namespace_id, chunk_bytes)
  SELECT namespace_id, nullif(chunk_bytes, 0) FROM (SELECT f.namespace_id, sum(p.bytes) AS chunk_bytes FROM per_request p JOIN fenced f ON f.id = p.request_id AND f.attempt = p.attempt GROUP BY f.namespace_id) AS added
  RETURNING 1
), notified AS (
  SELECT sarsen.bus_notify($8::text::text, array_agg(ev.request_id), array_agg(CASE ev.event WHEN 'frames' THEN 'f' WHEN 'state' THEN 's' WHEN 'cancel' THEN 'c' ELSE 'x' END), array_agg(ev.arg::text)) FROM (SELECT request_id, 'frames' AS event, seq AS arg FROM per_request) AS ev
)
SELECT p.request_id, p.attempt, p.seq, (SELECT count(*) FROM notified) + (SELECT count(*) FROM stored) AS side_effects
  FROM per_request p
