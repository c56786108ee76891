-- Up Migration

-- Less index work per request (issue 62, target 3). No record is touched: only indexes of
-- sarsen.requests are rebuilt (new partitions take them from the parent, src/db/partitions.ts).
--
-- 1. One index of finished records by namespace and finish time, where there were two (005's
--    for the retention sweep, unswept ones only; 009's for GET /usage's partial hour, every
--    one), and every finished request entered both. Unswept and swept records are its two
--    halves: the sweep reads the unswept one (a namespace's range of it, or the whole half for
--    records of deleted namespaces, as it read 005's index), usage a range in each.
DROP INDEX sarsen.requests_retention_idx;
DROP INDEX sarsen.requests_namespace_finished_idx;
CREATE INDEX requests_namespace_finished_idx ON sarsen.requests (expired, namespace_id, finished_at)
  WHERE status IN ('succeeded', 'failed');

-- 2. The listing-row sweep reads swept records by finish time (src/db/retention.ts): 005's
--    index held every finished record, an entry from every terminal write. It holds the swept
--    ones only now, whose entry the sweep's own write of `expired` adds: a request that is
--    answered writes none.
DROP INDEX sarsen.requests_finished_idx;
CREATE INDEX requests_finished_idx ON sarsen.requests (finished_at) WHERE expired AND status IN ('succeeded', 'failed');
