-- Explicit cancel (issue 18): the database-side mark the executor holding a running attempt
-- checks at its claim and at every lease renewal, so a lost notification cannot leave a
-- cancelled request running. A pending request is finished by the cancel itself.
ALTER TABLE sarsen.requests ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;
