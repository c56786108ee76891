-- Up Migration

-- Less written per accepted request outside its request row (issue 62: rows and WAL per request
-- halved).

-- 1. One counter delta per namespace and key where there were two. The statements that accept
-- submissions and write answers appended a row per namespace to usage_rollup_deltas and a row per
-- key to key_usage_deltas, each deleted again by the fold (migration 028). They now append one row
-- here per namespace and key that carries both: the namespace's figures, and, where `hour` is set,
-- the key's figures for that hour (src/db/counters.ts addToBoth). A keyed row's provider calls
-- and cache hits count for its namespace and its key alike. A figure a row does not add is NULL
-- rather than 0 (nothing stored), except the token sums, which stay NULL until something reports
-- a number, as in key_usage_hourly. The other write paths (frames, traffic of retried attempts,
-- sweeps) append to usage_rollup_deltas as before; both older tables stay folded and read, so a
-- process of the release before, folding or appending while this one starts, loses nothing.
CREATE TABLE sarsen.counter_deltas (
  namespace_id            text NOT NULL,
  api_key_id              text,
  hour                    timestamptz,
  accepted_submissions    bigint,
  provider_calls          bigint,
  upstream_sent_bytes     bigint,
  upstream_received_bytes bigint,
  request_bytes           bigint,
  response_bytes          bigint,
  chunk_bytes             bigint,
  cache_hits              bigint,
  ledger_events           bigint,
  prompt_tokens           bigint,
  completion_tokens       bigint,
  total_tokens            bigint,
  CHECK ((hour IS NULL) = (api_key_id IS NULL))
);
-- As for the other delta tables: visited often, never truncated (an exclusive lock every hot
-- statement would queue on).
ALTER TABLE sarsen.counter_deltas SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, vacuum_truncate = false);
