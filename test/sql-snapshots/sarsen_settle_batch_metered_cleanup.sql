WITH input AS MATERIALIZED (
  SELECT i.*, coalesce((
      SELECT (ceil(coalesce(i.prompt, 0) * p.prompt_micros_per_mtok / 1e6)
            + ceil(coalesce(i.completion, 0) * p.completion_micros_per_mtok / 1e6))::bigint
        FROM sarsen.prices p WHERE p.model = i.model), 0) AS micros
    FROM (SELECT t.*, CASE WHEN t.body_size >= 0 THEN substring($22::bytea FROM (sum(greatest(t.body_size, 0)) OVER (ORDER BY t.ord) - t.body_size + 1)::int FOR t.body_size) END AS body
    FROM unnest($1::text[], $2::int[], $3::text[], $4::text[], $5::int[], $6::text[], $7::int[], $8::int[], $9::text[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[], $15::bigint[], $16::int[], $17::boolean[], $18::text[], $19::int[], $20::text[], $21::boolean[]) WITH ORDINALITY AS t(id, attempt, model, outcome, http_status, content_type, body_size, error_status, retry_after, prompt, completion, total, sent, received, chunk_bytes, last_seq, reached, ending, provider_status, transport_error, cacheable, ord)) AS i
), done AS (
  UPDATE sarsen.requests q
     SET status = i.outcome, finished_at = now(), lease_owner = NULL, lease_expires_at = NULL, next_retry_at = NULL,
         prompt_tokens = i.prompt, completion_tokens = i.completion, total_tokens = i.total,
         error_status = i.error_status, retry_after = i.retry_after, response_bytes = octet_length(i.body),
         chunk_bytes = i.chunk_bytes, seq_high = greatest(q.seq_high, i.last_seq),
         cost_micros = q.cost_micros + i.micros, provider_reached = CASE WHEN q.provider_reached IS NULL THEN NULL ELSE q.provider_reached OR i.reached END,
         attempt_log = CASE WHEN q.attempt_started_at IS NULL THEN q.attempt_log ELSE q.attempt_log || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
    'attempt', q.attempts, 'started_at', q.attempt_started_at, 'ended_at', now(), 'backend_id', q.backend_id,
    'outcome', i.ending::text, 'status', i.provider_status::int, 'retry_after', i.retry_after::text,
    'error', i.transport_error::text))) END,
         attempt_started_at = NULL,
         -- An answer the cache may not serve loses the key it would be found under.
         cache_key = CASE WHEN i.cacheable THEN q.cache_key END
    FROM input i
   WHERE q.id = i.id AND q.id = ANY($1::text[]) AND q.id >= sarsen.least_id($1::text[]) AND q.attempts = i.attempt AND q.status = 'running'
  RETURNING q.id, q.tenancy_id, q.namespace_id, q.api_key_id, i.micros, i.outcome, i.http_status, i.content_type, i.body,
            i.prompt, i.completion, i.total, i.sent, i.received,
            -- The request's provider call, counted once, now it has settled (NULL: counted by the old rule).
            coalesce(q.provider_reached, false) AS provider_call, q.token_limited
), answer AS (
  INSERT INTO sarsen.responses (request_id, status, content_type, body) SELECT id, http_status, content_type, body FROM done
), rollup AS (
  INSERT INTO sarsen.counter_deltas (namespace_id, api_key_id, hour, provider_calls, upstream_sent_bytes, upstream_received_bytes, response_bytes, ledger_events, prompt_tokens, completion_tokens, total_tokens)
  SELECT namespace_id, CASE WHEN keyed THEN api_key_id END, CASE WHEN keyed AND api_key_id IS NOT NULL THEN date_trunc('hour', now()) END,
         nullif(provider_calls, 0), nullif(upstream_sent_bytes, 0), nullif(upstream_received_bytes, 0), nullif(response_bytes, 0), nullif(ledger_events, 0), prompt_tokens, completion_tokens, total_tokens
    FROM (SELECT namespace_id, api_key_id, bool_or((outcome = 'succeeded' OR provider_call OR coalesce(prompt, completion, total) IS NOT NULL)) AS keyed,
            count(*) FILTER (WHERE provider_call) AS provider_calls, sum(sent) AS upstream_sent_bytes,
            sum(received) AS upstream_received_bytes, sum(octet_length(body)) AS response_bytes,
            count(*) FILTER (WHERE micros > 0 AND (outcome = 'succeeded' OR provider_call OR coalesce(prompt, completion, total) IS NOT NULL)) AS ledger_events,
            sum(prompt) FILTER (WHERE (outcome = 'succeeded' OR provider_call OR coalesce(prompt, completion, total) IS NOT NULL)) AS prompt_tokens, sum(completion) FILTER (WHERE (outcome = 'succeeded' OR provider_call OR coalesce(prompt, completion, total) IS NOT NULL)) AS completion_tokens,
            sum(total) FILTER (WHERE (outcome = 'succeeded' OR provider_call OR coalesce(prompt, completion, total) IS NOT NULL)) AS total_tokens
       FROM done GROUP BY namespace_id, api_key_id) AS added
), entry AS (
  INSERT INTO sarsen.ledger (tenancy_id, namespace_id, api_key_id, request_id, kind, amount_micros)
  SELECT tenancy_id, namespace_id, api_key_id, id, 'tokens', micros FROM done WHERE micros > 0
), forgotten AS (
  DELETE FROM sarsen.request_credentials k WHERE k.request_id = ANY (ARRAY(SELECT id FROM done))
), released AS (
  DELETE FROM sarsen.idempotency_claims k WHERE k.request_id = ANY (ARRAY(SELECT id FROM done WHERE outcome = 'failed'))
), charged AS (
  UPDATE sarsen.credit c SET balance_micros = c.balance_micros - t.micros
    FROM (SELECT tenancy_id, sum(micros) AS micros FROM done WHERE micros > 0 GROUP BY tenancy_id) AS t
   WHERE c.tenancy_id = t.tenancy_id
), spent AS (
  INSERT INTO sarsen.monthly_spend (scope_id, month, spent_micros)
  SELECT scope, date_trunc('month', now())::date, sum(p.micros)
    FROM done p, LATERAL (VALUES (p.api_key_id), (p.namespace_id)) AS s(scope)
   WHERE p.micros > 0 AND scope IS NOT NULL
   GROUP BY scope
  ON CONFLICT (scope_id, month) DO UPDATE SET spent_micros = monthly_spend.spent_micros + EXCLUDED.spent_micros
)
SELECT id, (SELECT sarsen.bus_notify($23::text::text, array_agg(ev.request_id), array_agg(CASE ev.event WHEN 'frames' THEN 'f' WHEN 'state' THEN 's' WHEN 'cancel' THEN 'c' ELSE 'x' END), array_agg(ev.arg::text)) FROM (SELECT id AS request_id, 'state' AS event, outcome AS arg FROM done) AS ev) AS side_effects FROM done
