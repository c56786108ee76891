-- Request events are NOTIFYed only while another Sarsen process listens (issue 13). A process
-- delivers what it produced to its own readers in memory; a NOTIFY serves only the others. With
-- none, it cost every notifying commit a database-wide lock held through its fsync (PostgreSQL
-- serialises the commits of notifying transactions) and woke every listening backend.
--
-- A process's bus connection is named 'sarsen-bus <origin>' (its application_name, visible in
-- pg_stat_activity from the moment it connects). A statement about to notify asks
-- bus_has_peers(its origin) whether any other such connection exists in this database.
--
-- The race this closes: a process whose bus connects while another's statement has already
-- looked (and found nobody) but not yet committed would miss that commit's event and read the
-- database before it commits. So the look is taken under a shared transaction-level advisory
-- lock, and a bus that has connected and LISTENs calls bus_join(), which takes the same lock
-- exclusively, and so waits until every statement that looked before it was visible has
-- committed, before the process reads anything or serves. Any statement that looks afterwards
-- sees it.
CREATE FUNCTION sarsen.bus_has_peers(origin text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock_shared(99498034462723); -- 0x5a7e_3100_0003
  RETURN EXISTS (
    SELECT 1 FROM pg_stat_get_activity(NULL) AS a
     WHERE a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND (a.application_name LIKE 'sarsen-bus %' AND a.application_name <> 'sarsen-bus ' || origin
            -- A process of a release before this one (a rolling upgrade): it is always told.
            OR a.application_name = 'sarsen-bus')
  );
END $$;

CREATE FUNCTION sarsen.bus_join() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_lock(99498034462723);
  PERFORM pg_advisory_unlock(99498034462723);
END $$;
