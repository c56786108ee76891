-- Up Migration

-- How often executors run the retention sweep (docs/accounting.md "Retention"): its own setting,
-- since it reads every namespace's horizon and need not run as often as the lease sweep.
INSERT INTO sarsen.settings (name, value) VALUES ('retention_sweep_interval_ms', '60000');

-- The retention sweep walks each namespace's unswept, finished records oldest first.
CREATE INDEX requests_retention_idx ON sarsen.requests (namespace_id, finished_at)
  WHERE NOT expired AND status IN ('succeeded', 'failed');
-- The longer horizons: listing metadata by finish time, the ledger by creation time.
CREATE INDEX requests_finished_idx ON sarsen.requests (finished_at) WHERE status IN ('succeeded', 'failed');
CREATE INDEX key_usage_hourly_hour_idx ON sarsen.key_usage_hourly (hour);
