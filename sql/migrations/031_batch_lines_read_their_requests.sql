-- Up Migration

-- A batch line that became a request keeps no copy of how that request went (issue 61;
-- docs/api.md "Batches"). Until now each dispatch round copied `requests.status` into the
-- line's `state` (`running`, then `succeeded` or `failed`), a mirror kept by polling; now such a
-- line is `dispatched` and its state is read from its request, the only record of it. A line
-- that never became a request (waiting, refused, canceled, expired) keeps its own state.
--
-- Every row stays: lines that ran keep their request_id, from which their end is read. A line
-- whose request is no longer stored (past the listing horizon) reads as failed, with
-- `record_expired`, as its result already said.
ALTER TABLE sarsen.batch_lines DROP CONSTRAINT batch_lines_state_check;
UPDATE sarsen.batch_lines SET state = 'dispatched' WHERE state IN ('running', 'succeeded', 'failed');
ALTER TABLE sarsen.batch_lines ADD CONSTRAINT batch_lines_state_check
  CHECK (state IN ('waiting', 'dispatched', 'refused', 'canceled', 'expired'));
-- The dispatcher counts lines in flight from the live requests (src/db/batches.ts), not from the lines.
DROP INDEX sarsen.batch_lines_running_idx;

-- A line's size in its OpenAI result file, set when its batch ends: as it is written with its
-- request's stored answer, and as it is written once retention swept that answer. A batch's
-- output and error files are sized from these, so `bytes` is what the file holds now.
ALTER TABLE sarsen.batch_lines ADD COLUMN result_bytes integer, ADD COLUMN swept_bytes integer;
-- An output or error file's `bytes` is null: it is summed from its lines when read. Files of
-- batches that ended before this migration keep the bytes recorded then.
ALTER TABLE sarsen.files ALTER COLUMN bytes DROP NOT NULL;
