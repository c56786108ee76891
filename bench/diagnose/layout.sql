-- What would a request write under another layout of its records? (issue 62, target 3)
--
-- Run against a database Sarsen has migrated, alone on the machine:
--   psql -h 127.0.0.1 -U postgres -d <database> -f bench/diagnose/layout.sql
-- It builds copies of the tables a non-streaming request writes, in a schema of its own
-- (layout_probe, dropped at the end), and sends them the rows Sarsen's acceptance and terminal
-- writes send, 16 requests a transaction as a group commit does, with the sizes of bench:work's
-- requests (a body of about 80 bytes, an answer of about 215). It prints the WAL a request for:
--   today         the request row inserted, then updated at its end (every index twice), the
--                 body and the answer in rows of their own, the idempotency claim, the ledger
--                 entry, a counter delta a flush;
--   append-only   the request row written once, without the columns its end changes in any
--                 index; its lease in a row of its own, deleted at the end; its end (status,
--                 finish, tokens, bytes and the answer) one row, indexed for the accounts;
--   without the claim and the ledger entry, and without the body's row as well: what is left
--                 when only the records that cannot move remain, to size what each costs;
--   claim in the body  today's, but the claim a column of the body's row (the namespace's and the
--                 body's hash, indexed), found by a lookup that an advisory lock a hash serialises
--                 (taken inside the statement by a PL/pgSQL function, whose own statements see what
--                 committed before it got the lock): no claim row, nothing to release or sweep;
--   the end a HOT update  today's tables, but no index names a column the end changes (status,
--                 finish, lease), so the end updates the row in its page and adds no index entry:
--                 the lease found by its owner (an index on the owner, set at acceptance and left
--                 at the end), the finished and failed records by the ledger entry, which the end
--                 writes anyway. The request table's fill factor is 50 (psql -v fillfactor=N):
--                 a batch inserts its rows together and ends them together, so a page needs room
--                 for a second version of each;
--   append-only, the claim in the body  the leanest that still writes everything a request keeps:
--                 the request row once, the claim in the body's row, the ledger entry of its own.
-- The request tables are copied from sarsen.requests (columns, defaults, checks) and indexed as
-- Sarsen indexes them; the others are written out below, as their migrations make them. The
-- copies are plain tables, not partitioned: the WAL a row is the same.
\set ON_ERROR_STOP on
\set QUIET on
-- psql -v batches=N -v namespaces=N to change them (transactions of 16 requests a layout and round; namespaces they spread over).
\if :{?batches} \else \set batches 600 \endif
\if :{?namespaces} \else \set namespaces 50 \endif
\if :{?fillfactor} \else \set fillfactor 50 \endif
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS layout_probe CASCADE;
CREATE SCHEMA layout_probe;
SET search_path = layout_probe;

-- The request row: its key and listing indexes in both layouts; today's adds the indexes that
-- name the columns its end changes.
CREATE TABLE requests_once (LIKE sarsen.requests INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE requests_once ADD PRIMARY KEY (id);
CREATE INDEX ON requests_once (namespace_id, id DESC);
CREATE INDEX ON requests_once (namespace_id, api_key_id, id DESC);
CREATE INDEX ON requests_once (namespace_id, model, id DESC);
CREATE INDEX ON requests_once (namespace_id, dialect, id DESC);
CREATE TABLE requests (LIKE requests_once INCLUDING ALL);
CREATE INDEX ON requests (lease_expires_at) WHERE lease_expires_at IS NOT NULL;
CREATE INDEX ON requests (id) WHERE status = 'pending';
CREATE INDEX ON requests (namespace_id, id DESC) WHERE status = 'failed';
CREATE INDEX ON requests (expired, namespace_id, finished_at) WHERE status IN ('succeeded', 'failed');
CREATE INDEX ON requests (finished_at) WHERE expired AND status IN ('succeeded', 'failed');
CREATE INDEX ON requests (namespace_id, cache_key, finished_at DESC) WHERE cache_key IS NOT NULL AND status = 'succeeded' AND NOT expired;
CREATE TABLE requests_hot (LIKE requests_once INCLUDING ALL) WITH (fillfactor = :fillfactor);
CREATE INDEX ON requests_hot (lease_owner, id);
CREATE TABLE bodies (request_id text PRIMARY KEY, body text NOT NULL);
CREATE TABLE claimed_bodies (request_id text PRIMARY KEY, body text NOT NULL, identity bytea NOT NULL);
CREATE INDEX ON claimed_bodies (identity);
CREATE TABLE responses (request_id text PRIMARY KEY, status int NOT NULL, content_type text, body bytea NOT NULL);
CREATE TABLE claims (namespace_id text NOT NULL, identity bytea NOT NULL, request_id text NOT NULL, expires_at timestamptz NOT NULL, PRIMARY KEY (namespace_id, identity));
CREATE INDEX ON claims (expires_at);
CREATE INDEX ON claims (request_id);
CREATE TABLE ledger (id bigserial, tenancy_id text NOT NULL, namespace_id text NOT NULL, api_key_id text, request_id text NOT NULL, kind text NOT NULL,
  amount_micros bigint NOT NULL DEFAULT 0, created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON ledger (namespace_id, created_at) INCLUDE (api_key_id);
CREATE INDEX ON ledger (tenancy_id, id DESC);
CREATE INDEX ON ledger (namespace_id, request_id DESC) WHERE kind = 'failed';
CREATE TABLE deltas (LIKE sarsen.counter_deltas INCLUDING DEFAULTS);

-- The append-only layout (its request row is requests_once, above).
CREATE TABLE leases (request_id text PRIMARY KEY, owner text NOT NULL, expires_at timestamptz NOT NULL);
CREATE INDEX ON leases (expires_at);
CREATE TABLE endings (request_id text PRIMARY KEY, namespace_id text NOT NULL, status text NOT NULL, finished_at timestamptz NOT NULL,
  prompt_tokens bigint, completion_tokens bigint, total_tokens bigint, cost_micros bigint NOT NULL, error_status int,
  response_bytes bigint NOT NULL, chunk_bytes bigint NOT NULL, http_status int NOT NULL, content_type text, body bytea NOT NULL,
  expired boolean NOT NULL DEFAULT false);
CREATE INDEX ON endings (expired, namespace_id, finished_at);
CREATE INDEX ON endings (namespace_id, request_id DESC) WHERE status = 'failed';
CREATE SEQUENCE ids;

-- layout: 0 today, 1 append-only, 2 append-only without the claim and the ledger entry, 3 and without the body's row,
-- 4 today's with the claim in the body's row, 5 today's with the end a HOT update, 6 append-only with the claim in the body's row.
CREATE PROCEDURE run(layout int, batches int, namespaces int) LANGUAGE plpgsql AS $$
DECLARE
  ids text[];
BEGIN
  FOR b IN 1..batches LOOP
    SELECT array_agg('req_01M8Z5KH' || lpad(to_hex(nextval('ids')), 16, '0')) INTO ids FROM generate_series(1, 16);
    CREATE TEMP TABLE IF NOT EXISTS batch (id text, namespace_id text) ON COMMIT DELETE ROWS;
    INSERT INTO batch SELECT id, 'nsp_01M8Z5KH00000000000000' || (hashtext(id) & 2147483647) % namespaces FROM unnest(ids) id;
    IF layout = 5 THEN
      INSERT INTO requests_hot (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model, forwarded_headers, hops,
                                request_bytes, cost_micros, status, attempts, lease_owner, lease_expires_at, started_at, attempt_started_at)
      SELECT id, 'ten_01M8Z5KH0000000000000000', namespace_id, 'key_01M8Z5KH0000000000000000', 'bck_01M8Z5KH0000000000000000', 'chat', false,
             'gpt-bench', 'gpt-bench', '[]', 0, 80, 0, 'running', 1, 'prc_01M8Z5KH0000000000000000', now() + interval '30 s', now(), now() FROM batch;
    ELSIF layout IN (0, 4) THEN
      INSERT INTO requests (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model, forwarded_headers, hops,
                            request_bytes, cost_micros, status, attempts, lease_owner, lease_expires_at, started_at, attempt_started_at)
      SELECT id, 'ten_01M8Z5KH0000000000000000', namespace_id, 'key_01M8Z5KH0000000000000000', 'bck_01M8Z5KH0000000000000000', 'chat', false,
             'gpt-bench', 'gpt-bench', '[]', 0, 80, 0, 'running', 1, 'prc_01M8Z5KH0000000000000000', now() + interval '30 s', now(), now() FROM batch;
    ELSE
      INSERT INTO requests_once (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model, forwarded_headers, hops,
                                 request_bytes, cost_micros, status, attempts, started_at, attempt_started_at)
      SELECT id, 'ten_01M8Z5KH0000000000000000', namespace_id, 'key_01M8Z5KH0000000000000000', 'bck_01M8Z5KH0000000000000000', 'chat', false,
             'gpt-bench', 'gpt-bench', '[]', 0, 80, 0, 'running', 1, now(), now() FROM batch;
      INSERT INTO leases SELECT id, 'prc_01M8Z5KH0000000000000000', now() + interval '30 s' FROM batch;
    END IF;
    IF layout IN (4, 6) THEN
      INSERT INTO claimed_bodies SELECT id, '{"model":"gpt-bench","messages":[{"role":"user","content":"work 5f1c09ab ' || id || '"}]}',
             sha256(convert_to(namespace_id || id, 'UTF8')) FROM batch;
    ELSIF layout < 3 OR layout = 5 THEN
      INSERT INTO bodies SELECT id, '{"model":"gpt-bench","messages":[{"role":"user","content":"work 5f1c09ab ' || id || '"}]}' FROM batch;
    END IF;
    IF layout < 2 OR layout = 5 THEN
      INSERT INTO claims SELECT namespace_id, sha256(convert_to(id, 'UTF8')), id, now() + interval '10 min' FROM batch;
    END IF;
    IF layout < 2 OR layout >= 4 THEN
      INSERT INTO ledger (tenancy_id, namespace_id, api_key_id, request_id, kind)
      SELECT 'ten_01M8Z5KH0000000000000000', namespace_id, 'key_01M8Z5KH0000000000000000', id, 'execution' FROM batch;
    END IF;
    INSERT INTO deltas (namespace_id, accepted_submissions, request_bytes) VALUES ('nsp_01M8Z5KH000000000000000', 16, 1280);
    COMMIT;
    INSERT INTO batch SELECT id, 'nsp_01M8Z5KH00000000000000' || (hashtext(id) & 2147483647) % namespaces FROM unnest(ids) id;
    IF layout = 5 THEN
      UPDATE requests_hot q SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL, provider_reached = true,
             prompt_tokens = 10, completion_tokens = 20, total_tokens = 30, response_bytes = 215, seq_high = 0,
             attempt_log = '[{"attempt":1,"status":200,"ms":3}]'
       WHERE q.id = ANY (ids);
    ELSIF layout IN (0, 4) THEN
      UPDATE requests q SET status = 'succeeded', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL, provider_reached = true,
             prompt_tokens = 10, completion_tokens = 20, total_tokens = 30, response_bytes = 215, seq_high = 0,
             attempt_log = '[{"attempt":1,"status":200,"ms":3}]'
       WHERE q.id = ANY (ids);
    END IF;
    IF layout IN (0, 4, 5) THEN
      INSERT INTO responses SELECT id, 200, 'application/json',
             convert_to(rpad('{"id":"chatcmpl-' || id || '","object":"chat.completion","choices":[{"message":{"role":"assistant","content":"', 200, 'x') || '"}}]}', 'UTF8') FROM batch;
    ELSE
      DELETE FROM leases WHERE request_id = ANY (ids);
      INSERT INTO endings SELECT id, namespace_id, 'succeeded', now(), 10, 20, 30, 0, NULL, 215, 0, 200, 'application/json',
             convert_to(rpad('{"id":"chatcmpl-' || id || '","object":"chat.completion","choices":[{"message":{"role":"assistant","content":"', 200, 'x') || '"}}]}', 'UTF8') FROM batch;
    END IF;
    INSERT INTO deltas (namespace_id, response_bytes, prompt_tokens) VALUES ('nsp_01M8Z5KH000000000000000', 3440, 160);
    COMMIT;
  END LOOP;
END $$;

CREATE TABLE results (layout int, round int, wal_a_request numeric);
CREATE PROCEDURE measure(layout int, round int, batches int, namespaces int) LANGUAGE plpgsql AS $$
DECLARE
  before pg_lsn := pg_current_wal_insert_lsn();
BEGIN
  CALL run(layout, batches, namespaces);
  INSERT INTO results VALUES (layout, round, round(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), before) / (batches * 16.0)));
  COMMIT;
END $$;

-- A warm-up of each layout (pages and indexes past their first splits), then three rounds in turn.
CREATE PROCEDURE rounds(batches int, namespaces int) LANGUAGE plpgsql AS $$
BEGIN
  FOR layout IN 0..6 LOOP CALL measure(layout, 0, batches / 4, namespaces); END LOOP;
  FOR round IN 1..3 LOOP
    FOR layout IN 0..6 LOOP CALL measure(layout, round, batches, namespaces); END LOOP;
  END LOOP;
END $$;
CALL rounds(:batches, :namespaces);

SELECT CASE results.layout WHEN 0 THEN 'today' WHEN 1 THEN 'append-only' WHEN 2 THEN 'append-only, no claim or ledger entry'
                   WHEN 3 THEN 'append-only, no claim, ledger entry or body row' WHEN 4 THEN 'today''s, the claim in the body''s row' WHEN 5 THEN 'today''s, the end a HOT update' ELSE 'append-only, the claim in the body''s row' END AS layout,
       string_agg(wal_a_request::text, ' · ' ORDER BY round) AS "WAL a request, by round",
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY wal_a_request)::numeric / (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY wal_a_request) FROM results WHERE layout = 0 AND round > 0)::numeric, 2) AS "× today"
  FROM results WHERE round > 0 GROUP BY results.layout ORDER BY results.layout;

SELECT n_tup_upd AS "the HOT layout's ends", n_tup_hot_upd AS "of which HOT" FROM pg_stat_user_tables WHERE relid = 'requests_hot'::regclass;

RESET search_path;
DROP SCHEMA layout_probe CASCADE;
