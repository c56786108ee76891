-- Up Migration

-- `provider_calls` counts requests that reached a provider (a connection carried the request),
-- once each, when the request settles; it used to count every request claimed for its first
-- attempt, reached or not. `provider_reached` says whether an attempt of the request has
-- reached one so far. Rows from before this migration keep NULL: the old rule counted them
-- already, and a NULL is never counted again (no table rewrite: existing rows stay NULL,
-- new rows default to false). Requests no attempt has claimed yet were not counted: they
-- join the new rule.
ALTER TABLE sarsen.requests ADD COLUMN provider_reached boolean;
ALTER TABLE sarsen.requests ALTER COLUMN provider_reached SET DEFAULT false;
UPDATE sarsen.requests SET provider_reached = false WHERE status = 'pending' AND attempts = 0;

-- GET /usage itemises a window exact to the millisecond: whole hours from key_usage_hourly,
-- and the partial hour at its start from the events themselves, attributed to the same
-- instants the hourly rows were added at: ledger entries by their creation, a request's
-- provider call and tokens by its terminal write.
CREATE INDEX ledger_namespace_created_idx ON sarsen.ledger (namespace_id, created_at) INCLUDE (api_key_id);
CREATE INDEX requests_namespace_finished_idx ON sarsen.requests (namespace_id, finished_at)
  WHERE status IN ('succeeded', 'failed');
