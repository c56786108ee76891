-- Up Migration

-- Requests (docs/api.md "The request record"; docs/durability.md "Request states"): the row
-- is the source of truth; graphile-worker only delivers work. Bodies, answers and frames live
-- in their own tables so the retention sweep can remove them while the metadata (status,
-- model, tokens, cost, timings) stays.
CREATE TABLE sarsen.requests (
  id                text PRIMARY KEY CHECK (id LIKE 'req\_%'),
  tenancy_id        text NOT NULL,
  namespace_id      text NOT NULL,
  api_key_id        text,
  backend_id        text NOT NULL,
  dialect           text NOT NULL CHECK (dialect IN ('chat', 'messages')),
  streaming         boolean NOT NULL,
  model             text NOT NULL,  -- as the caller asked
  upstream_model    text NOT NULL,  -- as sent, after a rule's rewrite
  status            text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'running', 'succeeded', 'failed')),
  -- `attempt` is the fencing token: every write an attempt makes is conditional on it.
  attempts          integer NOT NULL DEFAULT 0,
  recoveries        integer NOT NULL DEFAULT 0,
  next_retry_at     timestamptz,
  lease_owner       text,
  lease_expires_at  timestamptz,
  -- Provider-readable headers the caller sent (name, value pairs), replayed on every attempt.
  forwarded_headers jsonb NOT NULL DEFAULT '[]',
  hops              integer NOT NULL DEFAULT 0,
  -- Stream frames are numbered per request, increasing across attempts: the highest number
  -- ever used, and the first number of the current attempt (readers holding an older one
  -- were following an attempt that has been discarded).
  seq_high          integer NOT NULL DEFAULT 0,
  stream_first_seq  integer,
  prompt_tokens     bigint,
  completion_tokens bigint,
  total_tokens      bigint,
  cost_micros       bigint NOT NULL DEFAULT 0,
  error_status      integer,
  retry_after       text,
  request_bytes     bigint NOT NULL DEFAULT 0,
  response_bytes    bigint NOT NULL DEFAULT 0,
  chunk_bytes       bigint NOT NULL DEFAULT 0,
  expired           boolean NOT NULL DEFAULT false,
  created_at        timestamptz NOT NULL DEFAULT now(),
  started_at        timestamptz,
  finished_at       timestamptz
);
CREATE INDEX requests_namespace_idx ON sarsen.requests (namespace_id, id DESC);
CREATE INDEX requests_running_lease_idx ON sarsen.requests (lease_expires_at) WHERE status = 'running';

-- The canonical body exactly as sent upstream (model rewritten when a rule says so).
CREATE TABLE sarsen.request_bodies (
  request_id text PRIMARY KEY REFERENCES sarsen.requests (id) ON DELETE CASCADE,
  body       text NOT NULL
);

-- The terminal answer: a success body, or the stored error body, byte for byte.
CREATE TABLE sarsen.responses (
  request_id   text PRIMARY KEY REFERENCES sarsen.requests (id) ON DELETE CASCADE,
  status       integer NOT NULL,
  content_type text,
  body         bytea NOT NULL
);

-- Stream frames, byte-exact, numbered per request across attempts.
CREATE TABLE sarsen.chunks (
  request_id text NOT NULL REFERENCES sarsen.requests (id) ON DELETE CASCADE,
  seq        integer NOT NULL,
  attempt    integer NOT NULL,
  frame      bytea NOT NULL,
  PRIMARY KEY (request_id, seq)
);

-- Idempotency claims: one live execution per (namespace, identity) within the window. A
-- terminal failure deletes its claim; an expired claim is replaced by the next submission.
CREATE TABLE sarsen.idempotency_claims (
  namespace_id text NOT NULL,
  identity     bytea NOT NULL,
  request_id   text NOT NULL,
  expires_at   timestamptz NOT NULL,
  PRIMARY KEY (namespace_id, identity)
);
CREATE INDEX idempotency_claims_request_idx ON sarsen.idempotency_claims (request_id);
CREATE INDEX idempotency_claims_expiry_idx ON sarsen.idempotency_claims (expires_at);

-- All-time namespace counters, sharded so concurrent submissions do not queue on one row;
-- a read sums the shards.
CREATE TABLE sarsen.usage_rollup (
  namespace_id            text NOT NULL,
  shard                   smallint NOT NULL,
  accepted_submissions    bigint NOT NULL DEFAULT 0,
  provider_calls          bigint NOT NULL DEFAULT 0,
  upstream_sent_bytes     bigint NOT NULL DEFAULT 0,
  upstream_received_bytes bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (namespace_id, shard)
);
