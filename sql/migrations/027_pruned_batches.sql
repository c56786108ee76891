-- Up Migration

-- A batch statement names its rows by an array of ids (`id = ANY($1::text[])`). A prepared
-- statement runs a generic plan, and a generic plan of a partitioned table covers every
-- partition: an array cannot be pruned by, so its executor opened and probed each one on every
-- execution, and a claim, a lease renewal, a terminal write or a flush of frames cost more with
-- each day of payloads and each month of request rows kept (docs/storage.md "Cost of many
-- partitions"). The array's least id bounds the key too (`id >= sarsen.least_id($1)`): an
-- immutable function of a parameter, evaluated as the executor starts, which prunes every
-- partition below it before opening one. Ids sort by creation time, so what is left is the
-- partition of the batch's oldest id and those after it (a few days made ahead). Compared in the
-- column's own collation, as the partition bounds are.
--
-- No upper bound: two bounds of unknown value are estimated to select almost nothing, and on a
-- small table the planner then scanned a whole index led by the namespace instead of probing the
-- primary key, a plan a connection keeps while its tables grow.
--
-- PL/pgSQL, not SQL: PostgreSQL plans an SQL function's body again in every execution of the
-- statement calling it, once per place it is called (0.3 ms a claim), where a PL/pgSQL function
-- is compiled once per session (under a microsecond for four ids, 7 µs for 64). An array that is
-- null, empty or all nulls bounds nothing: its least id is '', below every id (and `= ANY` of it
-- matches no row anyway).
CREATE FUNCTION sarsen.least_id(ids text[]) RETURNS text LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
  id text;
  lowest text;
BEGIN
  IF ids IS NULL THEN
    RETURN '';
  END IF;
  FOREACH id IN ARRAY ids LOOP
    IF lowest IS NULL OR id < lowest THEN
      lowest := id;
    END IF;
  END LOOP;
  RETURN coalesce(lowest, '');
END $$;
