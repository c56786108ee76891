-- The attempt history (issue 18): one JSON object per attempt that ended (its number, when it
-- started and ended, the backend it called, how it ended), appended by the statement that ends
-- it. `attempt_started_at` is the running attempt's start (NULL when none runs). Never a
-- prompt, an answer body or a credential.
ALTER TABLE sarsen.requests
  ADD COLUMN attempt_log jsonb NOT NULL DEFAULT '[]',
  ADD COLUMN attempt_started_at timestamptz;
