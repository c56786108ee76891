// The counters every write path adds to: all-time namespace totals (usage_rollup) and per-key
// hourly figures (key_usage_hourly), read by GET /usage and GET /storage (accounting.ts). A write
// path does not update them: it appends what it adds, one plain row per namespace (or key) per
// statement, to a delta table with no index and no key (migration 028), so a hot statement looks
// nothing up and locks nothing. The watching executor folds the deltas into the counters
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
 * INSERT of what a statement adds to the namespace totals. `select` yields `namespace_id` and
 * one column per name in `columns`.
 */
export function addToRollup(columns: readonly RollupColumn[], select: string): string {
  return `INSERT INTO sarsen.usage_rollup_deltas (namespace_id, ${columns.join(', ')})
  SELECT namespace_id, ${columns.join(', ')} FROM (${select}) AS added`;
}

type KeyColumn = 'ledger_events' | 'provider_calls' | 'prompt_tokens' | 'completion_tokens' | 'total_tokens' | 'cache_hits';
const KEY_COLUMNS: readonly KeyColumn[] = ['ledger_events', 'provider_calls', 'prompt_tokens', 'completion_tokens', 'total_tokens', 'cache_hits'];
const NULLABLE: readonly KeyColumn[] = ['prompt_tokens', 'completion_tokens', 'total_tokens'];

/**
 * INSERT of what a statement adds to this hour's per-key figures. `select` yields
 * `namespace_id`, `api_key_id` and the named columns. Token sums stay NULL until something
 * reports a number.
 */
export function addToKeyHour(columns: readonly KeyColumn[], select: string): string {
  return `INSERT INTO sarsen.key_usage_deltas (namespace_id, api_key_id, hour, ${columns.join(', ')})
  SELECT namespace_id, api_key_id, date_trunc('hour', now()), ${columns.join(', ')} FROM (${select}) AS added`;
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

const FOLDS = [
  foldSql('usage_rollup_deltas', 'usage_rollup', ['namespace_id'], ROLLUP_COLUMNS, (c) => `c.${c} + EXCLUDED.${c}`),
  // NULL plus NULL is NULL, NULL plus a count is the count.
  foldSql('key_usage_deltas', 'key_usage_hourly', ['namespace_id', 'hour', 'api_key_id'], KEY_COLUMNS, (c) =>
    NULLABLE.includes(c as KeyColumn) ? `CASE WHEN EXCLUDED.${c} IS NULL THEN c.${c} ELSE coalesce(c.${c}, 0) + EXCLUDED.${c} END` : `c.${c} + EXCLUDED.${c}`,
  ),
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
  await pool.query('VACUUM sarsen.usage_rollup_deltas, sarsen.key_usage_deltas');
}
