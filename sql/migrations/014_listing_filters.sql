-- The listing's filters (issue 17), each an index range newest first, so a filter that
-- matches little or nothing reads only what it returns instead of every request of the
-- namespace. The failed one holds failed rows only. Pending and running rows already have
-- partial indexes (010, 003), and the time range rides on requests_namespace_idx by id.
CREATE INDEX requests_namespace_key_idx ON sarsen.requests (namespace_id, api_key_id, id DESC);
CREATE INDEX requests_namespace_model_idx ON sarsen.requests (namespace_id, model, id DESC);
CREATE INDEX requests_namespace_failed_idx ON sarsen.requests (namespace_id, id DESC) WHERE status = 'failed';
