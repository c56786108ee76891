-- Up Migration

-- Background responses (issue 42, docs/api.md "Background responses"): GET .../v1/responses/{id}
-- takes the provider's `resp_...` id as well as Sarsen's request id, since a streaming caller
-- only ever sees the provider's events and the id in its `response.created`. The executor
-- writes one row per attempt that produced a provider response, before that attempt's answer
-- or first frame is stored, so every id a caller saw can be looked up. A new table: no existing
-- row changes. An id may recur (two namespaces, a provider that repeats ids): a lookup is
-- scoped to its namespace and takes the newest request, then its newest attempt.
--
-- An id lives as long as its request row (a swept record still answers 410 by it): the table is
-- range-partitioned by request id on the request rows' own bounds, created ahead and dropped
-- with them (src/db/partitions.ts, the REQUESTS family), and rows the listing sweep deletes one
-- by one take their ids along (src/db/retention.ts).
CREATE TABLE sarsen.provider_response_ids (
  namespace_id text NOT NULL,
  provider_id  text NOT NULL,
  request_id   text NOT NULL,
  attempt      integer NOT NULL,
  PRIMARY KEY (namespace_id, provider_id, request_id, attempt)
) PARTITION BY RANGE (request_id);
-- The ids of one request, for the console's request page and the sweeps.
CREATE INDEX provider_response_ids_request_idx ON sarsen.provider_response_ids (request_id);

DO $$
DECLARE
  p record;
BEGIN
  FOR p IN SELECT c.relname AS name, pg_get_expr(c.relpartbound, c.oid) AS bound
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = 'sarsen.requests'::regclass AND NOT i.inhdetachpending LOOP
    EXECUTE format('CREATE TABLE sarsen.%I PARTITION OF sarsen.provider_response_ids %s',
                   'provider_response_ids' || substr(p.name, length('requests') + 1), p.bound);
  END LOOP;
END $$;
