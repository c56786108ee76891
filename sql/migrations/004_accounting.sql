-- Up Migration

-- Storage held per namespace (docs/accounting.md "Storage"), maintained in the same transactions
-- that write or remove bodies, answers and frames, so reading it costs the same at any size.
ALTER TABLE sarsen.usage_rollup
  ADD COLUMN request_bytes  bigint NOT NULL DEFAULT 0,
  ADD COLUMN response_bytes bigint NOT NULL DEFAULT 0,
  ADD COLUMN chunk_bytes    bigint NOT NULL DEFAULT 0;

-- The fee ledger: one entry per accepted submission (an attach is an entry with no charge),
-- and one for the token cost of an execution that completed with a price. Micro-credits.
CREATE TABLE sarsen.ledger (
  id            bigserial PRIMARY KEY,
  tenancy_id    text NOT NULL,
  namespace_id  text NOT NULL,
  api_key_id    text,
  request_id    text NOT NULL,
  kind          text NOT NULL CHECK (kind IN ('execution', 'attach', 'tokens')),
  amount_micros bigint NOT NULL DEFAULT 0,
  created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_tenancy_idx ON sarsen.ledger (tenancy_id, id DESC);
CREATE INDEX ledger_created_idx ON sarsen.ledger (created_at);

-- Per-key usage by hour, for GET /usage's itemisation: a window of any length sums at most
-- 24 rows a day per key (times the shards that spread concurrent writers). Token sums stay
-- NULL until an answer under the key reports one.
CREATE TABLE sarsen.key_usage_hourly (
  namespace_id      text NOT NULL,
  api_key_id        text NOT NULL,
  hour              timestamptz NOT NULL,
  ledger_events     bigint NOT NULL DEFAULT 0,
  provider_calls    bigint NOT NULL DEFAULT 0,
  prompt_tokens     bigint,
  completion_tokens bigint,
  total_tokens      bigint,
  shard             smallint NOT NULL,
  PRIMARY KEY (namespace_id, hour, api_key_id, shard)
);

-- Credit per tenancy (metering), and month-to-date spend per key and per namespace (caps).
CREATE TABLE sarsen.credit (
  tenancy_id     text PRIMARY KEY,
  balance_micros bigint NOT NULL DEFAULT 0
);
CREATE TABLE sarsen.monthly_spend (
  scope_id     text NOT NULL,  -- an api_key_id or a namespace_id
  month        date NOT NULL,
  spent_micros bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (scope_id, month)
);

-- Token prices per model, micro-credits per million tokens. No row: no token charge.
CREATE TABLE sarsen.prices (
  model                     text PRIMARY KEY,
  prompt_micros_per_mtok    bigint NOT NULL CHECK (prompt_micros_per_mtok >= 0),
  completion_micros_per_mtok bigint NOT NULL CHECK (completion_micros_per_mtok >= 0),
  updated_at                timestamptz NOT NULL DEFAULT now()
);
