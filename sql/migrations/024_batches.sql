-- Up Migration

-- The vendors' batch APIs, served by Sarsen for every backend (issue 43; docs/api.md "Batches"):
-- OpenAI's Files and Batches, Anthropic's Message Batches. A batch is its lines; a line becomes
-- an ordinary request when the dispatcher hands it to the queue, a bounded number at a time, so
-- results are read from the requests' stored answers and never copied. Nothing existing changes.

INSERT INTO sarsen.settings (name, value) VALUES
  -- The largest file POST /files takes (the reference vendor's limit: 200 MB).
  ('batch_file_max_bytes',      '209715200'),
  -- The most lines one batch may hold (the reference vendor's limit: 50,000 for OpenAI).
  ('batch_max_lines',           '50000'),
  -- The largest POST /messages/batches body: inline requests, above the 2 MiB submission limit.
  ('message_batch_max_bytes',   '268435456'),
  -- Batch lines in flight (dispatched, not ended) across the deployment: what interactive traffic keeps.
  ('batch_lines_in_flight',     '32'),
  -- How long a message batch may run before its unrun lines expire (the vendor's 24 hours).
  ('message_batch_window_ms',   '86400000');

-- An uploaded file: its bytes as sent, in pieces of up to 1 MiB (file_chunks); counted in
-- GET /storage as file_bytes. A batch's output and error files are rows without pieces: their
-- content is built from the lines' stored answers when read.
CREATE TABLE sarsen.files (
  id           text PRIMARY KEY,
  tenancy_id   text NOT NULL,
  namespace_id text NOT NULL,
  purpose      text NOT NULL,
  filename     text NOT NULL,
  bytes        bigint NOT NULL DEFAULT 0,
  -- Output and error files: the batch and which of its files.
  batch_id     text,
  kind         text CHECK (kind IN ('output', 'error')),
  created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX files_namespace_idx ON sarsen.files (namespace_id, id);
CREATE INDEX files_created_idx ON sarsen.files (created_at);

CREATE TABLE sarsen.file_chunks (
  file_id text NOT NULL,
  seq     integer NOT NULL,
  data    bytea NOT NULL,
  PRIMARY KEY (file_id, seq)
);

-- A batch. Its status is derived from these times and its lines (src/db/batches.ts).
CREATE TABLE sarsen.batches (
  id                text PRIMARY KEY,
  vendor            text NOT NULL CHECK (vendor IN ('openai', 'anthropic')),
  tenancy_id        text NOT NULL,
  namespace_id      text NOT NULL,
  api_key_id        text NOT NULL,
  dialect           text NOT NULL,
  endpoint          text NOT NULL,
  input_file_id     text,
  completion_window text NOT NULL,
  metadata          jsonb,
  -- The validation errors of a batch that failed (the vendor's `errors.data`); it has no lines.
  errors            jsonb,
  total             integer NOT NULL DEFAULT 0,
  created_at        timestamptz NOT NULL DEFAULT now(),
  expires_at        timestamptz NOT NULL,
  cancelling_at     timestamptz,
  expired_at        timestamptz,
  finalizing_at     timestamptz,
  ended_at          timestamptz,
  -- A key over its rate limit: no line is dispatched before this.
  paused_until      timestamptz,
  output_file_id    text,
  error_file_id     text
);
CREATE INDEX batches_namespace_idx ON sarsen.batches (namespace_id, id);
CREATE INDEX batches_active_idx ON sarsen.batches (id) WHERE ended_at IS NULL;

-- A line: `waiting` holds its canonical body until dispatched; `running` names its request;
-- `succeeded`/`failed` copy the request's end; `refused` is a line Sarsen would have answered
-- with an error (its code, status and message); `canceled` and `expired` never ran.
CREATE TABLE sarsen.batch_lines (
  batch_id      text NOT NULL,
  line          integer NOT NULL,
  custom_id     text NOT NULL,
  state         text NOT NULL CHECK (state IN ('waiting', 'running', 'succeeded', 'failed', 'refused', 'canceled', 'expired')),
  model         text,
  body          text,
  request_id    text,
  error_code    text,
  error_status  integer,
  error_message text,
  PRIMARY KEY (batch_id, line)
);
CREATE INDEX batch_lines_waiting_idx ON sarsen.batch_lines (batch_id, line) WHERE state = 'waiting';
CREATE INDEX batch_lines_running_idx ON sarsen.batch_lines (request_id) WHERE state = 'running';
CREATE INDEX batch_lines_request_idx ON sarsen.batch_lines (request_id) WHERE request_id IS NOT NULL;
