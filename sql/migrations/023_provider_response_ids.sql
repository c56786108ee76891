-- Up Migration

-- Background responses (issue 42, docs/api.md "Background responses"): GET .../v1/responses/{id}
-- takes the provider's `resp_...` id as well as Sarsen's request id, since a streaming caller
-- only ever sees the provider's events and the id in its `response.created`. The executor
-- writes one row per attempt that produced a provider response, before that attempt's answer
-- or first frame is stored, so every id a caller saw can be looked up. A new table: no existing
-- row changes. An id may recur (two namespaces, a provider that repeats ids): a lookup is
-- scoped to its namespace and takes the newest request, then its newest attempt.
CREATE TABLE sarsen.provider_response_ids (
  namespace_id text NOT NULL,
  provider_id  text NOT NULL,
  request_id   text NOT NULL,
  attempt      integer NOT NULL,
  PRIMARY KEY (namespace_id, provider_id, request_id, attempt)
);
-- The ids of one request, for the console's request page. A row whose request the metadata
-- horizon deleted finds no request: the id is then unknown.
CREATE INDEX provider_response_ids_request_idx ON sarsen.provider_response_ids (request_id);
