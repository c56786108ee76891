-- Up Migration

-- Less index work per request (issue 62, target 3). No record is touched: only indexes of
-- sarsen.requests are rebuilt (new partitions take them from the parent, src/db/partitions.ts).
--
-- 1. The listing's indexes keep a namespace's requests oldest first. Declared `id DESC`
--    (migrations 003, 014, 021), every new request went to the left end of its namespace's
--    range, where a full leaf page splits in halves and logs the older half (about 4 kB) every
--    few dozen requests, leaving each page half empty for good. Ascending, a new request goes to
--    the right end: where that is the end of the index (the namespace created last, as
--    namespace ids sort by creation time), the last page splits leaving the old page full;
--    elsewhere pages still split in halves, as before. A listing page, newest first, is the
--    same index range read backwards.
DROP INDEX sarsen.requests_namespace_idx;
CREATE INDEX requests_namespace_idx ON sarsen.requests (namespace_id, id);
DROP INDEX sarsen.requests_namespace_key_idx;
CREATE INDEX requests_namespace_key_idx ON sarsen.requests (namespace_id, api_key_id, id);
DROP INDEX sarsen.requests_namespace_model_idx;
CREATE INDEX requests_namespace_model_idx ON sarsen.requests (namespace_id, model, id);
DROP INDEX sarsen.requests_namespace_dialect_idx;
CREATE INDEX requests_namespace_dialect_idx ON sarsen.requests (namespace_id, dialect, id);
DROP INDEX sarsen.requests_namespace_failed_idx;
CREATE INDEX requests_namespace_failed_idx ON sarsen.requests (namespace_id, id) WHERE status = 'failed';

-- 2. One index of finished records by namespace and finish time, where there were two (005's
--    for the retention sweep, unswept ones only; 009's for GET /usage's partial hour, every
--    one), and every finished request entered both. Unswept and swept records are its two
--    halves: the sweep reads the unswept one (a namespace's range of it, or the whole half for
--    records of deleted namespaces, as it read 005's index), usage a range in each.
DROP INDEX sarsen.requests_retention_idx;
DROP INDEX sarsen.requests_namespace_finished_idx;
CREATE INDEX requests_namespace_finished_idx ON sarsen.requests (expired, namespace_id, finished_at)
  WHERE status IN ('succeeded', 'failed');

-- 3. The listing-row sweep reads swept records by finish time (src/db/retention.ts): 005's
--    index held every finished record, an entry from every terminal write. It holds the swept
--    ones only now, whose entry the sweep's own write of `expired` adds: a request that is
--    answered writes none.
DROP INDEX sarsen.requests_finished_idx;
CREATE INDEX requests_finished_idx ON sarsen.requests (finished_at) WHERE expired AND status IN ('succeeded', 'failed');
