-- Fallback backends (issue 18): a routing rule's backends to try, in order, after a retryable
-- failure on the one before. A request copies its rule's list at acceptance and keeps the
-- ones not yet tried; `backend_id` always names the backend of its latest attempt.
ALTER TABLE sarsen.routing_rules ADD COLUMN fallback_backend_ids text[] NOT NULL DEFAULT '{}';
ALTER TABLE sarsen.requests ADD COLUMN fallback_backend_ids text[] NOT NULL DEFAULT '{}';
