-- Up Migration

-- Sign-in throttling (docs/administration.md "Sign-in throttling"): attempts counted per account
-- and per client address in a window that starts with the first attempt. `key` is an HMAC
-- (api-key-hash-key) of the tenancy and normalised email, or of the client address: neither is
-- stored in the clear. An attempt counts before its password is checked, so parallel guesses
-- cannot slip past the limit; a success takes its own count back and clears its account's.
CREATE TABLE sarsen.sign_in_attempts (
  key          bytea PRIMARY KEY,
  attempts     integer NOT NULL,
  window_start timestamptz NOT NULL
);
-- Ended windows are swept a few at a time by the attempts that follow.
CREATE INDEX sign_in_attempts_window_idx ON sarsen.sign_in_attempts (window_start);

INSERT INTO sarsen.settings (name, value) VALUES
  ('sign_in_failures_per_account', '10'),
  ('sign_in_failures_per_address', '100'),
  ('sign_in_window_ms',            '900000'),
  ('trusted_proxy_hops',           '0');
