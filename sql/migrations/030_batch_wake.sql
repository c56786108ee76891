-- Up Migration

-- A new batch wakes the executors' batch dispatchers (src/executor/batch-dispatch.ts), which
-- otherwise sleep while no batch is active: they used to ask four times a second, in every
-- process, whether one was (docs/scaling.md "An idle process"). Sent at the commit that made
-- the batch, so its lines are there to be read.
CREATE FUNCTION sarsen.batch_created() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('sarsen_events', '{"k":"batch"}');
  RETURN NULL;
END $$;

CREATE TRIGGER batches_wake AFTER INSERT ON sarsen.batches
  FOR EACH STATEMENT EXECUTE FUNCTION sarsen.batch_created();
