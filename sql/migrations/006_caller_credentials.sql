-- Up Migration

-- A caller-credential backend's credential for one request (docs/api.md "Caller credentials"):
-- AES-256-GCM under credential-key, bound to the request id; kept for the life of the
-- attempts (retries and recoveries on any process use it) and deleted in the same
-- transaction that writes the request's terminal status. Never selected by a listing.
CREATE TABLE sarsen.request_credentials (
  request_id text PRIMARY KEY REFERENCES sarsen.requests (id) ON DELETE CASCADE,
  sealed     bytea NOT NULL
);
