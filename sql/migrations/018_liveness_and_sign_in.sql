-- Up Migration

-- Recovery within a second (issue 29). Every executor swept everything every sweep_interval_ms
-- (2 s), so a dead executor's work waited for the next sweep: the time from a kill to the new
-- attempt followed that interval. Now one executor watches the others (src/db/liveness.ts):
-- every liveness_check_ms it tries, in one statement, the liveness lock of each executor listed
-- here; a lock it can take belongs to a process that died, whose attempts it re-dispatches at
-- once. The full sweep stays, run by the watcher alone, as the backstop for expired leases and
-- owners that were never listed.
--
-- `job_pools` names the graphile-worker pools of the process (their id is a job's `locked_by`):
-- the jobs a dead process had fetched but not yet claimed, or finished but not yet completed,
-- are freed or deleted with it, instead of staying locked until a lease's time has passed.
--
-- An executor takes its liveness lock before it lists itself, so a listed executor whose lock
-- is free is dead; the watcher removes its row once nothing of it runs.
CREATE TABLE sarsen.executors (
  process_id text PRIMARY KEY,
  job_pools  text[] NOT NULL DEFAULT '{}',
  joined_at  timestamptz NOT NULL DEFAULT now()
);

INSERT INTO sarsen.settings (name, value) VALUES ('liveness_check_ms', '250');

-- A sign-in throttle that cannot lock the owner out (issue 29). Failures counted per account
-- locked the account for everyone, the right password from another address included: ten
-- guesses a window by anyone who knew the email kept the owner out. Attempts now count per
-- account and address together (sign_in_failures_per_account_address, the limit a guesser
-- meets), per address (unchanged), and per account as a ceiling that refuses only addresses
-- that already tried that account in the window. The account ceiling's default moves from 10
-- to 1000 where it was left at 10.
INSERT INTO sarsen.settings (name, value) VALUES ('sign_in_failures_per_account_address', '10');
UPDATE sarsen.settings SET value = '1000', updated_at = now() WHERE name = 'sign_in_failures_per_account' AND value = '10';
