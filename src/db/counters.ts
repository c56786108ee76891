// The counters every write path adds to: all-time namespace totals (usage_rollup) and per-key
// hourly figures (key_usage_hourly), read by GET /usage and GET /storage (accounting.ts). A write
// path does not update them: it appends what it adds, one plain row per namespace (and key) per
// statement, to a delta table with no index and no key (migrations 028 and 033), so a hot
// statement looks nothing up and locks nothing. The watching executor folds the deltas into the counters
// (foldCounters), and readers sum both, so every figure is exact to the last commit.
import type { Pool } from './pool.ts';

export type RollupColumn =
  | 'accepted_submissions'
  | 'provider_calls'
  | 'upstream_sent_bytes'
  | 'upstream_received_bytes'
  | 'request_bytes'
  | 'response_bytes'
  | 'chunk_bytes'
  | 'cache_hits';
/** Every column of the namespace totals, as GET /usage and GET /storage read them. */
export const ROLLUP_COLUMNS: readonly RollupColumn[] = [
  'accepted_submissions', 'provider_calls', 'upstream_sent_bytes', 'upstream_received_bytes', 'request_bytes', 'response_bytes', 'chunk_bytes', 'cache_hits',
];

/**
 * INSERT of what a statement adds to the namespace totals alone: a row of counter_deltas with no
 * key. `select` yields `namespace_id` and one column per name in `columns`.
 */
export function addToRollup(columns: readonly RollupColumn[], select: string): string {
  return `INSERT INTO sarsen.counter_deltas (namespace_id, ${columns.join(', ')})
  SELECT namespace_id, ${columns.map((c) => `nullif(${c}, 0)`).join(', ')} FROM (${select}) AS added`;
}

type KeyColumn = 'ledger_events' | 'provider_calls' | 'prompt_tokens' | 'completion_tokens' | 'total_tokens' | 'cache_hits';
const KEY_COLUMNS: readonly KeyColumn[] = ['ledger_events', 'provider_calls', 'prompt_tokens', 'completion_tokens', 'total_tokens', 'cache_hits'];
const NULLABLE: readonly KeyColumn[] = ['prompt_tokens', 'completion_tokens', 'total_tokens'];

/** The per-key figures only a key's delta carries (its provider calls and cache hits are its namespace's: see addToBoth). */
type KeyOnlyColumn = 'ledger_events' | 'prompt_tokens' | 'completion_tokens' | 'total_tokens';

/**
 * INSERT of what a statement adds to the namespace totals and to this hour's per-key figures:
 * one row of counter_deltas per namespace and key, where two tables took a row each (migration
 * 033). `select` yields `namespace_id`, `api_key_id`, `keyed` (whether the group adds to its
 * key's hour: a request whose key is gone, or a group with nothing a key counts, does not) and
 * one column per name. A keyed row's `provider_calls` and `cache_hits` count for its namespace
 * and its key alike, so `select` must count the same rows for both. A figure of 0 is stored as
 * NULL (nothing); token sums stay NULL until something reports a number.
 */
export function addToBoth(rollup: readonly RollupColumn[], key: readonly KeyOnlyColumn[], select: string): string {
  const columns = [...rollup, ...key];
  return `INSERT INTO sarsen.counter_deltas (namespace_id, api_key_id, hour, ${columns.join(', ')})
  SELECT namespace_id, CASE WHEN keyed THEN api_key_id END, CASE WHEN keyed AND api_key_id IS NOT NULL THEN date_trunc('hour', now()) END,
         ${columns.map((c) => (NULLABLE.includes(c as KeyColumn) ? c : `nullif(${c}, 0)`)).join(', ')}
    FROM (${select}) AS added`;
}

// How many deltas of each table one fold statement takes: a backlog (after a time with no
// watcher) is folded a bounded statement at a time.
const FOLD_BATCH = 10_000;

// Each fold deletes a batch of deltas and adds their sums in the same statement, so a reader's
// snapshot sees each delta once: as itself or in a counter. Another folder running at the same
// time (two watchers for a moment) skips the rows this one deleted; both add in key order, so
// neither waits on the other in a cycle. Folded counters go to shard 0 (older releases wrote to
// 16 shards, which readers still sum).
const foldSql = (deltas: string, counters: string, key: readonly string[], columns: readonly string[], add: (c: string) => string) => `WITH gone AS (
  DELETE FROM sarsen.${deltas}
   WHERE ctid = ANY(ARRAY(SELECT ctid FROM sarsen.${deltas} LIMIT ${FOLD_BATCH}))
  RETURNING *
), folded AS (
  INSERT INTO sarsen.${counters} AS c (${key.join(', ')}, shard, ${columns.join(', ')})
  SELECT ${key.join(', ')}, 0, ${columns.map((c) => `sum(${c})`).join(', ')} FROM gone GROUP BY ${key.join(', ')} ORDER BY ${key.join(', ')}
  ON CONFLICT (${key.join(', ')}, shard) DO UPDATE
    SET ${columns.map((c) => `${c} = ${add(c)}`).join(', ')}
  RETURNING 1
)
SELECT count(*)::int AS n FROM gone`;

// NULL plus NULL is NULL, NULL plus a count is the count.
const KEY_ADD = (c: string) =>
  NULLABLE.includes(c as KeyColumn) ? `CASE WHEN EXCLUDED.${c} IS NULL THEN c.${c} ELSE coalesce(c.${c}, 0) + EXCLUDED.${c} END` : `c.${c} + EXCLUDED.${c}`;

// A row of counter_deltas adds to its namespace's totals and, with an hour, to its key's: one
// statement deletes a batch and adds to both, so a reader sees each row once either way.
const FOLD_BOTH = `WITH gone AS (
  DELETE FROM sarsen.counter_deltas
   WHERE ctid = ANY(ARRAY(SELECT ctid FROM sarsen.counter_deltas LIMIT ${FOLD_BATCH}))
  RETURNING *
), folded AS (
  INSERT INTO sarsen.usage_rollup AS c (namespace_id, shard, ${ROLLUP_COLUMNS.join(', ')})
  SELECT namespace_id, 0, ${ROLLUP_COLUMNS.map((c) => `coalesce(sum(${c}), 0)`).join(', ')} FROM gone GROUP BY namespace_id ORDER BY namespace_id
  ON CONFLICT (namespace_id, shard) DO UPDATE
    SET ${ROLLUP_COLUMNS.map((c) => `${c} = c.${c} + EXCLUDED.${c}`).join(', ')}
  RETURNING 1
), keyed AS (
  INSERT INTO sarsen.key_usage_hourly AS c (namespace_id, hour, api_key_id, shard, ${KEY_COLUMNS.join(', ')})
  SELECT namespace_id, hour, api_key_id, 0, ${KEY_COLUMNS.map((c) => (NULLABLE.includes(c) ? `sum(${c})` : `coalesce(sum(${c}), 0)`)).join(', ')}
    FROM gone WHERE hour IS NOT NULL GROUP BY namespace_id, hour, api_key_id ORDER BY namespace_id, hour, api_key_id
  ON CONFLICT (namespace_id, hour, api_key_id, shard) DO UPDATE
    SET ${KEY_COLUMNS.map((c) => `${c} = ${KEY_ADD(c)}`).join(', ')}
  RETURNING 1
)
SELECT count(*)::int AS n FROM gone`;

const FOLDS = [
  FOLD_BOTH,
  // What releases before migration 033 appended (nothing writes these two tables any more).
  foldSql('usage_rollup_deltas', 'usage_rollup', ['namespace_id'], ROLLUP_COLUMNS, (c) => `c.${c} + EXCLUDED.${c}`),
  foldSql('key_usage_deltas', 'key_usage_hourly', ['namespace_id', 'hour', 'api_key_id'], KEY_COLUMNS, KEY_ADD),
];

/** Folds every delta committed so far into the counters. Answers how many it folded. */
export async function foldCounters(pool: Pick<Pool, 'query'>): Promise<number> {
  let total = 0;
  for (const sql of FOLDS) {
    for (;;) {
      const { rows } = await pool.query<{ n: number }>(sql);
      total += rows[0]!.n;
      if (rows[0]!.n < FOLD_BATCH) break;
    }
  }
  return total;
}

/**
 * Frees the space of folded deltas for new ones. Run by the watcher now and then, as
 * autovacuum would (it may be off; migration 028 asks it to visit these tables often).
 */
export async function vacuumDeltas(pool: Pick<Pool, 'query'>): Promise<void> {
  await pool.query('VACUUM sarsen.counter_deltas, sarsen.usage_rollup_deltas, sarsen.key_usage_deltas');
}
