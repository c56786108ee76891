-- Up Migration

-- The responses dialect (issue 31): the chat vendor's Responses API, served by chat backends
-- at the same address (docs/decisions.md "Responses: a dialect of the chat backends"). A
-- request's dialect is its route's, so requests may now say `responses`; a backend's dialect
-- stays `chat` or `messages` (its kind's), so sarsen.backends is unchanged.
--
-- The check is found by what it constrains rather than by name, so the migration holds
-- whatever shape the table has taken by now.
DO $$
DECLARE c record;
BEGIN
  FOR c IN
    SELECT conname FROM pg_constraint
     WHERE conrelid = 'sarsen.requests'::regclass AND contype = 'c'
       AND pg_get_constraintdef(oid) LIKE '%dialect%'
  LOOP
    EXECUTE format('ALTER TABLE sarsen.requests DROP CONSTRAINT %I', c.conname);
  END LOOP;
END $$;
ALTER TABLE sarsen.requests ADD CONSTRAINT requests_dialect_check CHECK (dialect IN ('chat', 'messages', 'responses'));

-- The listing's dialect filter, an index range newest first like the others (014).
CREATE INDEX requests_namespace_dialect_idx ON sarsen.requests (namespace_id, dialect, id DESC);
