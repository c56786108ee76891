-- Up Migration

-- Which Sarsen buses listen, as a table (issue 13). bus_has_peers() used to read
-- pg_stat_get_activity(), which builds a row for every backend slot of the server on every
-- look, paid by every terminal write, frame flush and sweep that produced events, to learn what
-- changes only when a process starts or stops; a one-row index read does not
-- (docs/performance.md "Costs measured in isolation").
--
-- A bus registers itself when it joins (bus_join(), after it LISTENs), and removes its row when
-- it closes. Rows of buses whose connection is gone (a process killed, a connection cut) are
-- removed by bus_reconcile(), which every joining bus and every recovery sweep runs; until
-- then they only cost a needless NOTIFY. bus_reconcile() also registers every bus connection
-- it finds, among them an earlier release's (named plain 'sarsen-bus', registered as ''): in a
-- rolling upgrade they were connected before the new processes joined.
--
-- The race 015 closed stays closed the same way: the look takes a shared transaction-level
-- advisory lock, then reads the table in a snapshot taken after it. bus_join() takes the lock
-- exclusively and holds it until its row is committed, so every statement that looked before
-- the row was visible has committed by then, and every one after sees it.
CREATE TABLE sarsen.bus_members (
  -- The process's id, as in its bus connection's application_name 'sarsen-bus <id>'.
  process_id text PRIMARY KEY,
  joined_at  timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION sarsen.bus_reconcile() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  WITH live AS (
    SELECT DISTINCT CASE WHEN a.application_name = 'sarsen-bus' THEN '' ELSE substr(a.application_name, 12) END AS process_id
      FROM pg_stat_get_activity(NULL) AS a
     WHERE a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND (a.application_name LIKE 'sarsen-bus %' OR a.application_name = 'sarsen-bus')
  ), gone AS (
    DELETE FROM sarsen.bus_members m WHERE m.process_id NOT IN (SELECT process_id FROM live)
  )
  INSERT INTO sarsen.bus_members (process_id) SELECT process_id FROM live ON CONFLICT DO NOTHING;
END $$;

CREATE OR REPLACE FUNCTION sarsen.bus_join() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  -- Registers the caller's bus (its connection is among those found) and forgets the dead.
  PERFORM sarsen.bus_reconcile();
  -- Held until this transaction commits, with the caller's row.
  PERFORM pg_advisory_xact_lock(99498034462723); -- 0x5a7e_3100_0003
END $$;

CREATE OR REPLACE FUNCTION sarsen.bus_has_peers(origin text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock_shared(99498034462723);
  RETURN EXISTS (SELECT 1 FROM sarsen.bus_members WHERE process_id <> origin);
END $$;

-- The buses connected now.
SELECT sarsen.bus_reconcile();
