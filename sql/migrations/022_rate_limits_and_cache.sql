-- Up Migration

-- Rate limits per key and an opt-in response cache (issue 32; docs/api.md "Rate limits" and
-- "Response cache").

-- A key's limits: requests accepted, and input plus output tokens charged, per minute. NULL: none.
ALTER TABLE sarsen.api_keys
  ADD COLUMN requests_per_minute integer CHECK (requests_per_minute > 0),
  ADD COLUMN tokens_per_minute bigint CHECK (tokens_per_minute > 0);

-- Limits are read from the per-process key cache: a change must reach every process's cache at
-- once, as a revocation does.
DROP TRIGGER api_keys_changed ON sarsen.api_keys;
CREATE TRIGGER api_keys_changed
  AFTER UPDATE OF revoked_at, grants, secret_hash, namespace_id, prefix, requests_per_minute, tokens_per_minute OR DELETE
  ON sarsen.api_keys FOR EACH ROW EXECUTE FUNCTION sarsen.api_key_changed();

-- Each limited key's current one-minute window (database clock), one row per key, reset in place
-- when a statement finds it past its minute. Written only by the submission statement, under the
-- row lock, so every process counts against the same figure. `tokens` is what that statement
-- read from key_window_tokens. `last_admitted` is what the latest submission statement admitted:
-- PostgreSQL 15's RETURNING sees only the new row, not the old. The limits are those the last
-- writer applied.
CREATE TABLE sarsen.key_windows (
  api_key_id    text PRIMARY KEY,
  window_start  timestamptz NOT NULL,
  requests      integer NOT NULL DEFAULT 0,
  tokens        bigint NOT NULL DEFAULT 0,
  refused       integer NOT NULL DEFAULT 0,
  last_admitted integer NOT NULL DEFAULT 0,
  request_limit integer,
  token_limit   bigint
);

-- The tokens charged to a key's current window, a row of their own: the terminal write charges
-- them, and a submission reads them without a lock, so settling answers never holds up the
-- submissions of the same key (a token limit is approximate in any case: docs/api.md).
CREATE TABLE sarsen.key_window_tokens (
  api_key_id    text PRIMARY KEY,
  window_start  timestamptz NOT NULL,
  tokens        bigint NOT NULL DEFAULT 0
);

-- The cache's life per namespace, in minutes; NULL: no cache (the default).
ALTER TABLE sarsen.namespaces ADD COLUMN cache_ttl_minutes integer CHECK (cache_ttl_minutes > 0);

-- Acceptance reads the namespace's cache life from the key cache (the key lookup joins the
-- namespace): a change forgets every cached key, in every process.
CREATE FUNCTION sarsen.namespace_cache_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('sarsen_events', json_build_object('k', 'api-key')::text);
  RETURN NULL;
END $$;
CREATE TRIGGER namespaces_cache_changed AFTER UPDATE OF cache_ttl_minutes ON sarsen.namespaces
  FOR EACH ROW WHEN (OLD.cache_ttl_minutes IS DISTINCT FROM NEW.cache_ttl_minutes)
  EXECUTE FUNCTION sarsen.namespace_cache_changed();

-- `cache_key`: the identity an execution's answer may be served under (set only when the cache
-- applied to its submission; docs/api.md "Response cache"). `cached_from`: the request whose
-- stored answer a cached request copied. `token_limited`: the request's key had a token limit
-- when it was accepted, so its terminal write charges the key's window.
ALTER TABLE sarsen.requests
  ADD COLUMN cache_key bytea,
  ADD COLUMN cached_from text,
  ADD COLUMN token_limited boolean NOT NULL DEFAULT false;
-- The newest servable answer per identity, found in one index range; only cached namespaces' rows.
CREATE INDEX requests_cache_idx ON sarsen.requests (namespace_id, cache_key, finished_at DESC)
  WHERE cache_key IS NOT NULL AND status = 'succeeded' AND NOT expired;

-- A ledger entry for an answer served from the cache: no charge, and the kind says why. The
-- check may also sit on partitions of their own (a partitioned ledger): every copy is replaced.
ALTER TABLE sarsen.ledger DROP CONSTRAINT IF EXISTS ledger_kind_check;
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN SELECT c.conrelid::regclass AS tbl FROM pg_constraint c JOIN pg_inherits i ON i.inhrelid = c.conrelid
            WHERE i.inhparent = 'sarsen.ledger'::regclass AND c.conname = 'ledger_kind_check' LOOP
    EXECUTE format('ALTER TABLE %s DROP CONSTRAINT ledger_kind_check', r.tbl);
  END LOOP;
END $$;
ALTER TABLE sarsen.ledger ADD CONSTRAINT ledger_kind_check CHECK (kind IN ('execution', 'attach', 'tokens', 'cached'));

-- Answers served from the cache, all-time per namespace and per key and hour (GET /usage).
ALTER TABLE sarsen.usage_rollup ADD COLUMN cache_hits bigint NOT NULL DEFAULT 0;
ALTER TABLE sarsen.key_usage_hourly ADD COLUMN cache_hits bigint NOT NULL DEFAULT 0;
