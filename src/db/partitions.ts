// Time partitions (migration 020, docs/storage.md): created ahead of time, and dropped whole
// once every row in them is past its horizon. Payloads (bodies, answers, frames) have a
// partition per UTC day and request rows one per month, both ranges of request ids (which sort
// by creation time); the ledger has one per month of created_at.
//
// Dropping a day of payloads writes O(1) rows: the statement that checks the day is past every
// horizon also takes its bytes off the storage counters (summed from the request rows, which
// carry each record's bytes) and moves `retired_payloads.below` past it, which is what makes
// its records read as swept. Then each partition is detached without blocking traffic and
// dropped. A pass killed halfway is finished by the next one (`finishRetired`).
import type { Pool } from './pool.ts';
import { withTransaction } from './pool.ts';
import { firstIdAt, idTime } from '../core/ids.ts';
import { rangesToCreate, partitionName, type Unit } from '../core/partitions.ts';
import { addToRollup } from './counters.ts';

type Db = Pick<Pool, 'query'>;

/**
 * SQL of the retired mark: a record whose id sorts below it had its payloads dropped with their
 * partition, and reads as swept (`expired`, no stored bytes, 410) though its row was never
 * written to.
 */
export const RETIRED = `(SELECT below FROM sarsen.retired_payloads)`;

type Family = Readonly<{ tables: readonly string[]; unit: Unit; byId: boolean; aheadMs: number; ownKey?: string }>;

const DAY_MS = 86_400_000;
export const PAYLOADS: Family = { tables: ['request_bodies', 'responses', 'chunks'], unit: 'day', byId: true, aheadMs: 3 * DAY_MS };
// The provider response ids of background responses live as long as their request rows (migration 023).
export const REQUESTS: Family = { tables: ['requests', 'provider_response_ids'], unit: 'month', byId: true, aheadMs: 31 * DAY_MS };
// The ledger's key is a sequence: each partition carries its own primary key (migration 020).
export const LEDGER: Family = { tables: ['ledger'], unit: 'month', byId: false, aheadMs: 31 * DAY_MS, ownKey: 'id' };
const FAMILIES = [PAYLOADS, REQUESTS, LEDGER];

// An id is made by its process's clock: a range is closed to new rows only this long after it ends.
const CLOCK_SLACK_MS = 60 * 60_000;
// Partition DDL waits at most this long for a lock (then the next pass tries again), so a
// long query can never make traffic queue behind it.
const LOCK_TIMEOUT = '5s';
// Serialises partition creation across processes (0x5a7e_3100_0028).
const CREATE_LOCK = 99498034462760;

export type Partition = {
  table: string;
  name: string;
  /** Range bounds as SQL literals (`lo` null: MINVALUE, the partition the migration attached). */
  lo: string | null;
  hi: string;
  loMs: number | null;
  hiMs: number;
  /** Detached concurrently, but not yet finalized (a pass was interrupted). */
  pending: boolean;
};

const LIST = `
SELECT p.relname AS "table", c.relname AS name, i.inhdetachpending AS pending, b[1] AS lo, b[2] AS hi,
       CASE WHEN p.relname = 'ledger' THEN extract(epoch FROM b[1]::timestamptz) * 1000 END AS lo_ms,
       CASE WHEN p.relname = 'ledger' THEN extract(epoch FROM b[2]::timestamptz) * 1000 END AS hi_ms
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
  JOIN pg_class p ON p.oid = i.inhparent
  JOIN pg_namespace n ON n.oid = p.relnamespace
  CROSS JOIN LATERAL (
    SELECT array(SELECT CASE WHEN v = 'MINVALUE' THEN NULL ELSE trim(BOTH '''' FROM v) END
                   FROM unnest(regexp_match(pg_get_expr(c.relpartbound, c.oid), '^FOR VALUES FROM \\((.*)\\) TO \\((.*)\\)$')) AS v) AS b
  ) AS bounds
 WHERE n.nspname = 'sarsen' AND p.relname = ANY($1::text[])`;

/** The partitions of the given tables, oldest first. */
export async function listPartitions(db: Db, tables: readonly string[]): Promise<Partition[]> {
  const { rows } = await db.query<{ table: string; name: string; pending: boolean; lo: string | null; hi: string; lo_ms: number | null; hi_ms: number | null }>(LIST, [tables]);
  return rows
    .map((r) => ({
      table: r.table,
      name: r.name,
      lo: r.lo,
      hi: r.hi,
      loMs: r.table === 'ledger' ? (r.lo_ms === null ? null : Number(r.lo_ms)) : r.lo === null ? null : idTime(r.lo),
      hiMs: r.table === 'ledger' ? Number(r.hi_ms) : idTime(r.hi),
      pending: r.pending,
    }))
    .sort((a, b) => a.hiMs - b.hiMs);
}

const bound = (family: Family, ms: number) => (family.byId ? firstIdAt('req', ms) : new Date(ms).toISOString());
const literal = (s: string) => `'${s.replace(/'/g, "''")}'`;

/**
 * Creates the partitions that are missing up to the family's reach ahead of `now`, one
 * transaction per table, under a lock that makes concurrent callers (every process ensures
 * them at startup, and the watching executor on every retention pass) create each once.
 * Answers how many it created.
 */
export async function ensurePartitions(pool: Pool, now = Date.now()): Promise<number> {
  const missing = (family: Family, partitions: readonly Partition[]) => {
    const newest = partitions.filter((p) => !p.pending).pop();
    const lastHi = newest?.hiMs ?? Date.UTC(new Date(now).getUTCFullYear(), new Date(now).getUTCMonth(), new Date(now).getUTCDate());
    return rangesToCreate(lastHi, now, family.unit, family.aheadMs);
  };
  // One look first: on almost every pass nothing is missing, which costs one statement rather
  // than a transaction a table.
  const known = await listPartitions(pool, FAMILIES.flatMap((f) => f.tables));
  let created = 0;
  for (const family of FAMILIES) {
    for (const table of family.tables) {
      if (missing(family, known.filter((p) => p.table === table)).length === 0) continue;
      created += await withTransaction(pool, async (c) => {
        await c.query(`SET LOCAL lock_timeout = '${LOCK_TIMEOUT}'`);
        await c.query('SELECT pg_advisory_xact_lock($1)', [CREATE_LOCK]);
        const ranges = missing(family, await listPartitions(c, [table]));
        for (const r of ranges) {
          const name = partitionName(table, r.lo, family.unit);
          const key = family.ownKey ? `, PRIMARY KEY (${family.ownKey})` : '';
          // CREATE TABLE ... PARTITION OF would lock the parent against every query; ATTACH
          // takes a lock that reads and writes pass.
          await c.query(`CREATE TABLE sarsen.${name} (LIKE sarsen.${table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION${key})`);
          await c.query(`ALTER TABLE sarsen.${table} ATTACH PARTITION sarsen.${name} FOR VALUES FROM (${literal(bound(family, r.lo))}) TO (${literal(bound(family, r.hi))})`);
        }
        return ranges.length;
      });
    }
  }
  return created;
}

/**
 * Detaches a partition without blocking reads and writes of its table, then drops it. `db` is
 * one session (a client), not a pool: the lock timeout is set on it, as CONCURRENTLY cannot run
 * in a transaction.
 */
async function dropPartition(db: Db, p: Partition): Promise<void> {
  await db.query(`SET lock_timeout = '${LOCK_TIMEOUT}'`);
  try {
    await db.query(`ALTER TABLE sarsen.${p.table} DETACH PARTITION sarsen.${p.name} ${p.pending ? 'FINALIZE' : 'CONCURRENTLY'}`);
    await db.query(`DROP TABLE sarsen.${p.name}`);
  } finally {
    await db.query('RESET lock_timeout');
  }
}

export async function retiredBelow(db: Db): Promise<string> {
  const { rows } = await db.query<{ below: string }>('SELECT below FROM sarsen.retired_payloads');
  return rows[0]!.below;
}

/**
 * Finishes what an interrupted pass left: payload partitions already retired (below the mark),
 * partitions left half-detached, and partitions detached but not dropped. Answers how many
 * tables it dropped.
 */
export async function finishRetired(db: Db): Promise<number> {
  const below = await retiredBelow(db);
  const all = await listPartitions(db, FAMILIES.flatMap((f) => f.tables));
  const left = all.filter((p) => p.pending || (PAYLOADS.tables.includes(p.table) && p.hi <= below));
  for (const p of left) await dropPartition(db, p);
  const { rows } = await db.query<{ name: string }>(
    `SELECT c.relname AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = 'sarsen' AND c.relkind = 'r' AND NOT c.relispartition
        AND c.relname ~ '^(request_bodies|responses|chunks|requests|provider_response_ids|ledger)_(p[0-9]{6}([0-9]{2})?|legacy)$'`,
  );
  for (const r of rows) await db.query(`DROP TABLE sarsen.${r.name}`);
  return left.length + rows.length;
}

export type Horizon = { namespace_id: string; minutes: number };

const RETIRE_PAYLOADS = `
WITH h AS (
  SELECT * FROM unnest($3::text[], $4::int[]) AS h(namespace_id, minutes)
), per_namespace AS (
  -- Records swept row by row already hold no bytes (and are past their horizon, whatever it is now).
  SELECT q.namespace_id,
         bool_and(q.expired OR (q.status IN ('succeeded', 'failed') AND q.finished_at < now() - make_interval(mins => coalesce(h.minutes, $5::int)))) AS past,
         sum(q.request_bytes) AS request_bytes, sum(q.response_bytes) AS response_bytes, sum(q.chunk_bytes) AS chunk_bytes
    FROM sarsen.requests q LEFT JOIN h ON h.namespace_id = q.namespace_id
   WHERE q.id >= $1 AND q.id < $2
   GROUP BY q.namespace_id
), verdict AS (
  SELECT NOT EXISTS (SELECT 1 FROM per_namespace WHERE NOT past) AS ok
), moved AS (
  UPDATE sarsen.retired_payloads SET below = $2 WHERE below < $2 AND (SELECT ok FROM verdict) RETURNING 1
), unstored AS (
  ${addToRollup(
    ['request_bytes', 'response_bytes', 'chunk_bytes'],
    `SELECT namespace_id, -request_bytes AS request_bytes, -response_bytes AS response_bytes, -chunk_bytes AS chunk_bytes
       FROM per_namespace WHERE EXISTS (SELECT 1 FROM moved) AND request_bytes + response_bytes + chunk_bytes > 0`,
  )}
  RETURNING 1
), claims AS (
  -- (Claims lapse within minutes; one this old would attach a caller to an answer that is gone.)
  DELETE FROM sarsen.idempotency_claims WHERE request_id >= $1 AND request_id < $2 AND EXISTS (SELECT 1 FROM moved) RETURNING 1
)
SELECT (SELECT ok FROM verdict) AS ok, (SELECT count(*) FROM unstored)::int + (SELECT count(*) FROM claims)::int AS side_effects`;

/**
 * Drops the oldest day of payloads while every record in it is past its namespace's horizon
 * (`horizons`; a namespace not listed, one since deleted, keeps the metadata horizon), at most
 * `max` days. Answers how many days it retired.
 */
export async function retirePayloads(db: Db, horizons: readonly Horizon[], metadataMinutes: number, max: number, now = Date.now()): Promise<number> {
  let days = 0;
  while (days < max) {
    const live = (await listPartitions(db, PAYLOADS.tables)).filter((p) => !p.pending);
    const oldest = live[0];
    if (!oldest || oldest.hiMs > now - CLOCK_SLACK_MS) break;
    const { rows } = await db.query<{ ok: boolean }>(RETIRE_PAYLOADS, [
      oldest.lo ?? '', oldest.hi, horizons.map((h) => h.namespace_id), horizons.map((h) => h.minutes), metadataMinutes,
    ]);
    if (!rows[0]!.ok) break;
    for (const p of live.filter((p) => p.hi <= oldest.hi)) await dropPartition(db, p);
    days++;
  }
  return days;
}

/**
 * Drops the oldest months of request rows once every row in them is past the listing horizon,
 * finished, and swept (row by row, or by the drop of its payloads). Answers how many.
 */
export async function retireRequestRows(db: Db, listingDays: number, now = Date.now()): Promise<number> {
  let months = 0;
  for (const p of (await listPartitions(db, REQUESTS.tables)).filter((x) => !x.pending)) {
    if (p.hiMs > now - listingDays * DAY_MS) break;
    const { rows } = await db.query<{ ok: boolean }>(
      `SELECT NOT EXISTS (
         SELECT 1 FROM sarsen.requests q
          WHERE q.id >= $1 AND q.id < $2
            AND NOT (q.status IN ('succeeded', 'failed') AND q.finished_at < now() - make_interval(days => $3::int)
                     AND (q.expired OR q.id < (SELECT below FROM sarsen.retired_payloads)))) AS ok`,
      [p.lo ?? '', p.hi, listingDays],
    );
    if (!rows[0]!.ok) break;
    await dropPartition(db, p);
    months++;
  }
  return months;
}

/** Drops the months of the ledger that end before its horizon. Answers how many. */
export async function retireLedger(db: Db, ledgerDays: number, now = Date.now()): Promise<number> {
  let months = 0;
  for (const p of (await listPartitions(db, LEDGER.tables)).filter((x) => !x.pending)) {
    if (p.hiMs > now - ledgerDays * DAY_MS) break;
    await dropPartition(db, p);
    months++;
  }
  return months;
}
