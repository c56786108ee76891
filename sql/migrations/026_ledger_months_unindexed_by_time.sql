-- Up Migration

-- Every accepted submission writes a ledger entry, and each index on the ledger is one more
-- entry that write makes (issue 44: a lighter acceptance commit). The ledger's months are
-- dropped whole once past its horizon (src/db/partitions.ts retireLedger), so nothing reads them
-- by creation time alone; only the legacy partition, the entries written before partitioning,
-- is swept row by row by it (src/db/retention.ts sweepLedger). The legacy partition gets an
-- index of its own (built here: it is the only one a row sweep walks), then the partitioned
-- index goes, and with it every month's copy. Nothing else read it: usage reads the ledger by
-- namespace and time, the billing pages by tenancy.
DO $$
BEGIN
  IF to_regclass('sarsen.ledger_legacy') IS NOT NULL THEN
    CREATE INDEX IF NOT EXISTS ledger_legacy_created_idx ON sarsen.ledger_legacy (created_at);
  END IF;
END $$;
DROP INDEX sarsen.ledger_created_idx;
