-- Up Migration

-- What the write paths add to the counters, appended instead of added in place (docs/accounting.md
-- "How the counters are kept"). Until now every submission, terminal write and flush of frames
-- ended with INSERT ... ON CONFLICT DO UPDATE on sarsen.usage_rollup and sarsen.key_usage_hourly:
-- a few rows updated thousands of times a second, each update a new row version on the same pages
-- and a row lock held to the commit. Now each statement appends one plain row per namespace (and
-- per key) to these tables, which have no index and no key: nothing to look up, nothing to lock.
--
-- The executor watching the others folds them in (src/db/counters.ts foldCounters): in one
-- transaction it deletes a batch of deltas and adds their sums to the counters, so every snapshot
-- sees each delta exactly once, either as itself or inside a counter. Readers sum both, so every
-- figure GET /usage and GET /storage answer stays exact to the statement that committed it.
CREATE TABLE sarsen.usage_rollup_deltas (
  namespace_id            text NOT NULL,
  accepted_submissions    bigint NOT NULL DEFAULT 0,
  provider_calls          bigint NOT NULL DEFAULT 0,
  upstream_sent_bytes     bigint NOT NULL DEFAULT 0,
  upstream_received_bytes bigint NOT NULL DEFAULT 0,
  request_bytes           bigint NOT NULL DEFAULT 0,
  response_bytes          bigint NOT NULL DEFAULT 0,
  chunk_bytes             bigint NOT NULL DEFAULT 0,
  cache_hits              bigint NOT NULL DEFAULT 0
);

-- Token sums stay NULL until something reports a number, as in key_usage_hourly.
CREATE TABLE sarsen.key_usage_deltas (
  namespace_id      text NOT NULL,
  api_key_id        text NOT NULL,
  hour              timestamptz NOT NULL,
  ledger_events     bigint NOT NULL DEFAULT 0,
  provider_calls    bigint NOT NULL DEFAULT 0,
  prompt_tokens     bigint,
  completion_tokens bigint,
  total_tokens      bigint,
  cache_hits        bigint NOT NULL DEFAULT 0
);

-- Rows live for a second or two: autovacuum, where it is on, visits often (the watcher vacuums
-- them too). No vacuum truncates them: that takes an exclusive lock, and every hot statement
-- appends here; the space of folded rows is reused instead.
ALTER TABLE sarsen.usage_rollup_deltas SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, vacuum_truncate = false);
ALTER TABLE sarsen.key_usage_deltas SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, vacuum_truncate = false);
