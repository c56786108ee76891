-- Up Migration

-- Less written per accepted request (issue 62: rows and WAL per request halved): one counter
-- delta per namespace and key where there were two. The statements that accept submissions and
-- write answers appended a row per namespace to usage_rollup_deltas and a row per key to
-- key_usage_deltas, each deleted again by the fold (migration 028). Every write path now appends
-- to this one table: a row carries its namespace's figures and, where `hour` is set, its key's
-- figures for that hour (src/db/counters.ts addToBoth); a row with no key adds to the namespace
-- alone (addToRollup). A keyed row's provider calls and cache hits count for its namespace and
-- its key alike. A figure a row does not add is NULL rather than 0 (nothing stored), except the
-- token sums, which stay NULL until something reports a number, as in key_usage_hourly. Nothing
-- writes the two older tables any more, but they stay folded and read: a process of the release
-- before, appending while this one starts, loses nothing.
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
