-- Up Migration

-- Tables that grow with traffic, partitioned by time (issue 28; docs/storage.md). Request ids
-- sort by creation time, so the request rows and the payload tables are range-partitioned by
-- request id: every primary key and every statement stays as it was. Bodies, answers and frames
-- get a partition per UTC day, request rows one per month; the ledger, whose id is a plain
-- sequence, one per month of created_at. src/db/partitions.ts creates partitions ahead and
-- drops those whose every row is past its horizon.
--
-- The existing tables are not copied: each becomes the first partition of its new parent (its
-- `_legacy` partition, from MINVALUE up to the start of tomorrow, UTC), keeping its rows, ids
-- and indexes. Attaching reads each table once to check its rows fit the range, and builds no
-- index (the parent's indexes are declared exactly as the old table's, which it adopts).

-- The smallest request id made at `at` (src/core/ids.ts firstIdAt): a ULID's 48-bit millisecond
-- time in Crockford base32, then the lowest random part.
CREATE FUNCTION sarsen.request_id_floor(at timestamptz) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  ms bigint := floor(extract(epoch FROM at) * 1000);
  out text := '';
BEGIN
  FOR i IN 1..10 LOOP
    out := substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', (ms % 32)::int + 1, 1) || out;
    ms := ms / 32;
  END LOOP;
  RETURN 'req_' || out || '0000000000000000';
END $$;

-- Payloads of every request whose id sorts below `below` went with their partitions: those
-- records read as swept (410, `expired`, no stored bytes) without a write to their rows. Moved
-- forward by each drop, in the same statement that takes the dropped bytes off the storage
-- counters (src/db/partitions.ts).
CREATE TABLE sarsen.retired_payloads (
  one   boolean PRIMARY KEY DEFAULT true CHECK (one),
  below text NOT NULL
);
INSERT INTO sarsen.retired_payloads (below) VALUES ('');

-- Payload rows are written in the statements that write their request (or fenced by it), and a
-- request row is removed only after its payloads: the foreign keys checked nothing those do not,
-- and would make a request partition impossible to drop without first scanning the payloads.
ALTER TABLE sarsen.request_bodies DROP CONSTRAINT request_bodies_request_id_fkey;
ALTER TABLE sarsen.responses DROP CONSTRAINT responses_request_id_fkey;
ALTER TABLE sarsen.chunks DROP CONSTRAINT chunks_request_id_fkey;
ALTER TABLE sarsen.request_credentials DROP CONSTRAINT request_credentials_request_id_fkey;

CREATE FUNCTION pg_temp.partition_table(tbl text, key text, upper_bound text, own_pkey boolean) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  defs text[];
  idx record;
  def text;
BEGIN
  -- Every index but the primary key, as declared (including any a later release added).
  SELECT coalesce(array_agg(pg_get_indexdef(i.indexrelid)), '{}') INTO defs
    FROM pg_index i WHERE i.indrelid = ('sarsen.' || tbl)::regclass AND NOT i.indisprimary;
  EXECUTE format('ALTER TABLE sarsen.%I RENAME TO %I', tbl, tbl || '_legacy');
  FOR idx IN SELECT c.relname, i.indisprimary FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
              WHERE i.indrelid = ('sarsen.' || tbl || '_legacy')::regclass LOOP
    IF idx.indisprimary THEN
      EXECUTE format('ALTER TABLE sarsen.%I RENAME CONSTRAINT %I TO %I', tbl || '_legacy', idx.relname, tbl || '_legacy_pkey');
    ELSE
      EXECUTE format('ALTER INDEX sarsen.%I RENAME TO %I', idx.relname, left(idx.relname, 56) || '_legacy');
    END IF;
  END LOOP;
  EXECUTE format('CREATE TABLE sarsen.%I (LIKE sarsen.%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION) PARTITION BY RANGE (%I)',
                 tbl, tbl || '_legacy', key);
  -- The ledger's key is its sequence alone, which cannot be a partitioned table's primary key:
  -- each of its partitions has its own (src/db/partitions.ts).
  IF NOT own_pkey THEN
    EXECUTE format('ALTER TABLE sarsen.%I ADD CONSTRAINT %I PRIMARY KEY (%s)', tbl, tbl || '_pkey',
                   (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY k.n)
                      FROM pg_index i CROSS JOIN unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
                      JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                     WHERE i.indrelid = ('sarsen.' || tbl || '_legacy')::regclass AND i.indisprimary));
  END IF;
  FOREACH def IN ARRAY defs LOOP
    EXECUTE def; -- names sarsen.<tbl>, now the parent: the legacy index is adopted, not rebuilt
  END LOOP;
  EXECUTE format('ALTER TABLE sarsen.%I ATTACH PARTITION sarsen.%I FOR VALUES FROM (MINVALUE) TO (%L)', tbl, tbl || '_legacy', upper_bound);
END $$;

DO $$
DECLARE
  tomorrow timestamptz := date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '1 day';
  cutover text := sarsen.request_id_floor(tomorrow);
  newest text := (SELECT max(id) FROM sarsen.requests);
BEGIN
  -- An id from a clock ahead of this one's moves the first new partition past it.
  WHILE newest IS NOT NULL AND newest >= cutover LOOP
    tomorrow := tomorrow + interval '1 day';
    cutover := sarsen.request_id_floor(tomorrow);
  END LOOP;
  PERFORM pg_temp.partition_table('requests', 'id', cutover, false);
  PERFORM pg_temp.partition_table('request_bodies', 'request_id', cutover, false);
  PERFORM pg_temp.partition_table('responses', 'request_id', cutover, false);
  PERFORM pg_temp.partition_table('chunks', 'request_id', cutover, false);
  PERFORM pg_temp.partition_table('ledger', 'created_at', greatest(tomorrow, (SELECT max(created_at) + interval '1 second' FROM sarsen.ledger))::text, true);
  ALTER SEQUENCE sarsen.ledger_id_seq OWNED BY sarsen.ledger.id;
END $$;
