-- The metrics' requests-by-state gauge counts pending requests through this small partial
-- index (running ones through requests_running_lease_idx) instead of scanning every record.
CREATE INDEX requests_pending_idx ON sarsen.requests (id) WHERE status = 'pending';
