-- Up Migration

-- Request events go to the processes that read the request, not to every listening bus
-- (docs/scaling.md, "Events between processes"). Every Sarsen process now LISTENs on a channel
-- of its own, 'sarsen_events_<tag>', besides the shared 'sarsen_events' (control messages).
-- Its tag is four characters that every request id it accepts ends in, so a statement that
-- produces an event for a request finds the process that accepted it (where its synchronous
-- caller, if any, waits) from the id alone, without a write per request. A process reading a
-- request that another accepted (an identical body that attached to it, a replay by id) says
-- so in bus_readers first. With one bus per process and a caller per request, each event
-- wakes one process however many there are, instead of all of them.
--
-- A statement about to notify takes the shared lock 017 takes (a joining bus waits for it),
-- then a shared lock per request key; a process registering as a reader takes those keys
-- exclusively until its rows are committed, so every statement that looked for readers
-- without seeing them has committed before the reader reads the database, and every one that
-- looks later sees them (the same race 015 closed for joining buses, per request). Keys are
-- taken in ascending order on both sides: they cannot deadlock.
--
-- bus_readers is UNLOGGED: it says which live connection wants what, and is worth nothing
-- after a crash or on a promoted standby, where every bus reconnects and registers again.
ALTER TABLE sarsen.bus_members ADD COLUMN tag text, ADD COLUMN executes boolean NOT NULL DEFAULT false;

CREATE UNLOGGED TABLE sarsen.bus_readers (
  request_id text NOT NULL,
  process_id text NOT NULL,
  PRIMARY KEY (request_id, process_id)
);
CREATE INDEX bus_readers_process ON sarsen.bus_readers (process_id);

-- One of 64 lock keys for a request (0x5a7e_3100_0100 + 0..63).
CREATE FUNCTION sarsen.bus_key(request_id text) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
  SELECT 99498034462976 + (hashtext(request_id) & 63)
$$;

-- A bus joins with its process's tag, and says whether the process executes (017's bus_join()
-- without them still works: an earlier release's process, told on the shared channel).
CREATE FUNCTION sarsen.bus_join(tag text, executes boolean) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM sarsen.bus_join();
  UPDATE sarsen.bus_members SET tag = bus_join.tag, executes = bus_join.executes
   WHERE process_id = split_part(current_setting('application_name'), ' ', 2);
END $$;

-- New jobs due now: one executor, drawn at random, is told to fetch (`J <jobs>` on its
-- channel), instead of every executor's job pool hearing graphile-worker's 'jobs:insert' and all
-- but one fetching nothing. The others fetch on their own poll. With no such executor listening
-- (none running, or only an earlier release's), 'jobs:insert' as graphile-worker's add_job sends it.
CREATE FUNCTION sarsen.wake_executors(jobs bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  chosen text;
BEGIN
  SELECT m.tag INTO chosen FROM sarsen.bus_members m WHERE m.executes AND m.tag IS NOT NULL ORDER BY random() LIMIT 1;
  IF chosen IS NULL THEN
    PERFORM pg_notify('jobs:insert', json_build_object('r', random(), 'count', jobs)::text);
  ELSE
    PERFORM pg_notify('sarsen_events_' || chosen, 'J ' || jobs);
  END IF;
END $$;

-- Forgets the readers of buses that are gone as well.
CREATE OR REPLACE FUNCTION sarsen.bus_reconcile() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  WITH live AS (
    SELECT DISTINCT CASE WHEN a.application_name = 'sarsen-bus' THEN '' ELSE substr(a.application_name, 12) END AS process_id
      FROM pg_stat_get_activity(NULL) AS a
     WHERE a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND (a.application_name LIKE 'sarsen-bus %' OR a.application_name = 'sarsen-bus')
  ), gone AS (
    DELETE FROM sarsen.bus_members m WHERE m.process_id NOT IN (SELECT process_id FROM live)
  ), unread AS (
    DELETE FROM sarsen.bus_readers r WHERE r.process_id NOT IN (SELECT process_id FROM live)
  )
  INSERT INTO sarsen.bus_members (process_id) SELECT process_id FROM live ON CONFLICT DO NOTHING;
END $$;

-- A process starts reading `follow` and stops reading `unfollow` (request ids).
CREATE FUNCTION sarsen.bus_follow(process text, follow text[], unfollow text[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  k bigint;
BEGIN
  IF cardinality(unfollow) > 0 THEN
    DELETE FROM sarsen.bus_readers WHERE process_id = process AND request_id = ANY (unfollow);
  END IF;
  IF cardinality(follow) > 0 THEN
    FOR k IN SELECT DISTINCT sarsen.bus_key(id) FROM unnest(follow) AS id ORDER BY 1 LOOP
      PERFORM pg_advisory_xact_lock(k);
    END LOOP;
    INSERT INTO sarsen.bus_readers (request_id, process_id) SELECT DISTINCT id, process FROM unnest(follow) AS id
      ON CONFLICT DO NOTHING;
  END IF;
END $$;

-- Sends request events (request `ids`, their event `codes` and arguments `args`) from process
-- `origin` to the processes that read them: the one that accepted the request
-- and those registered as its readers. A cancel ('c') goes to every process (whichever holds
-- the request's attempt acts on it; cancels are rare). So does every event while a process of
-- an earlier release listens (it knows only the shared channel). Nothing is sent while no
-- other process listens. At most 100 events a payload (request ids are ~30 characters:
-- well under NOTIFY's 8000 bytes). Answers how many NOTIFYs it sent.
CREATE FUNCTION sarsen.bus_notify(origin text, ids text[], codes text[], args text[]) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  k bigint;
  sent integer;
BEGIN
  IF cardinality(ids) IS NULL OR cardinality(ids) = 0 THEN
    RETURN 0;
  END IF;
  PERFORM pg_advisory_xact_lock_shared(99498034462723); -- 0x5a7e_3100_0003, as bus_has_peers()
  IF NOT EXISTS (SELECT 1 FROM sarsen.bus_members WHERE process_id <> origin) THEN
    RETURN 0;
  END IF;
  FOR k IN SELECT DISTINCT sarsen.bus_key(id) FROM unnest(ids) AS id ORDER BY 1 LOOP
    PERFORM pg_advisory_xact_lock_shared(k);
  END LOOP;
  -- (Each statement below takes its snapshot after the locks.)
  WITH ev AS (
    SELECT * FROM unnest(ids, codes, args) WITH ORDINALITY AS e(id, code, arg, n)
  ), everyone AS (
    SELECT EXISTS (SELECT 1 FROM sarsen.bus_members WHERE tag IS NULL AND process_id <> origin) AS older
  ), target AS (
    SELECT ev.n, 'sarsen_events_' || m.tag AS channel
      FROM ev JOIN sarsen.bus_members m ON m.tag = lower(right(ev.id, 4)) AND m.process_id <> origin
     WHERE ev.code <> 'c'
    UNION
    SELECT ev.n, 'sarsen_events_' || m.tag
      FROM ev JOIN sarsen.bus_readers r ON r.request_id = ev.id AND r.process_id <> origin
              JOIN sarsen.bus_members m ON m.process_id = r.process_id AND m.tag IS NOT NULL
     WHERE ev.code <> 'c'
    UNION
    SELECT ev.n, 'sarsen_events' FROM ev, everyone WHERE ev.code = 'c' OR everyone.older
  ), payload AS (
    SELECT t.channel, 'R ' || origin || ' ' || json_agg(json_build_array(ev.id, ev.code, ev.arg) ORDER BY ev.n)::text AS body
      FROM (SELECT target.*, (row_number() OVER (PARTITION BY channel ORDER BY n) - 1) / 100 AS part FROM target) AS t
      JOIN ev ON ev.n = t.n
     GROUP BY t.channel, t.part
  )
  SELECT count(pg_notify(channel, body)) INTO sent FROM payload;
  RETURN sent;
END $$;
