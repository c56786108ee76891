-- The sweep's index covers the rows holding a lease, not the rows whose status is 'running'
-- (the same rows: every write that makes a request running gives it a lease, and every write
-- that ends or hands back an attempt clears it). With `WHERE status = 'running'` it matched
-- every statement that names a running request by id (the terminal writes, frame flushes and
-- lease renewals all check `status = 'running'` as their fence), and a generic plan made while
-- few requests ran read the whole index and each of its rows to find a batch's few (every
-- running request, for each frame flush). Those statements cannot use this one,
-- so they reach their rows through the primary key.
DROP INDEX sarsen.requests_running_lease_idx;
CREATE INDEX requests_lease_idx ON sarsen.requests (lease_expires_at) WHERE lease_expires_at IS NOT NULL;
