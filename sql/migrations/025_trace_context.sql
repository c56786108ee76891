-- Up Migration

-- Tracing (issue 45; docs/operations.md "Tracing"): the W3C traceparent of the request that
-- created an execution, written by the acceptance statement, so an attempt claimed later, by
-- another process, continues that trace (or, recovered, links to it), and a submission that
-- attaches, or a replay, links to it. NULL while tracing is off. Nullable without a default:
-- adding it rewrites no row, and every existing record keeps its values.
ALTER TABLE sarsen.requests ADD COLUMN trace_parent text;
