// The sharded counters every write path adds to: all-time namespace totals (usage_rollup) and
// per-key hourly figures (key_usage_hourly). Shards keep concurrent writers off one row; reads
// sum them (accounting.ts). Every writer adds set-based, one row per namespace (or key) per
// statement, so an ON CONFLICT never touches a row twice.

const ROLLUP_SHARDS = 16;
/** A shard chosen at random per statement, for writers that run now and then. */
export const shard = (): number => Math.floor(Math.random() * ROLLUP_SHARDS);

// The group-committing writers of a process add to shards of their own, one per lane, chosen
// once per process: a counter row stays locked until its statement commits (fsync included),
// and two flushes of one process must never queue behind each other on it. The lanes of the
// two writers that add to per-key rows (submissions, terminals) differ modulo KEY_SHARDS too.
const base = shard();
const at = (offset: number) => (base + offset) % ROLLUP_SHARDS;
export const WRITER_SHARD = {
  submissions: [at(0), at(1)],
  terminals: [at(2), at(3)],
  frames: at(4),
} as const;
/**
 * Per-key hourly rows see far fewer writers than a namespace's counters, and GET /usage reads
 * one row per key, hour and shard of its window: a few shards keep that read small.
 */
export const KEY_SHARDS = 4;

type RollupColumn =
  | 'accepted_submissions'
  | 'provider_calls'
  | 'upstream_sent_bytes'
  | 'upstream_received_bytes'
  | 'request_bytes'
  | 'response_bytes'
  | 'chunk_bytes'
  | 'cache_hits';

/**
 * INSERT ... ON CONFLICT adding to the namespace totals. `select` yields `namespace_id` and one
 * column per name in `columns`, at most one row per namespace; `shard` is an SQL expression.
 */
export function addToRollup(columns: readonly RollupColumn[], select: string, shardSql: string): string {
  return `INSERT INTO sarsen.usage_rollup (namespace_id, shard, ${columns.join(', ')})
  SELECT namespace_id, ${shardSql}, ${columns.join(', ')} FROM (${select}) AS added
  ON CONFLICT (namespace_id, shard) DO UPDATE
    SET ${columns.map((c) => `${c} = usage_rollup.${c} + EXCLUDED.${c}`).join(', ')}`;
}

type KeyColumn = 'ledger_events' | 'provider_calls' | 'prompt_tokens' | 'completion_tokens' | 'total_tokens' | 'cache_hits';
const NULLABLE: readonly KeyColumn[] = ['prompt_tokens', 'completion_tokens', 'total_tokens'];

/**
 * INSERT ... ON CONFLICT adding to this hour's per-key figures. `select` yields `namespace_id`,
 * `api_key_id` and the named columns, at most one row per key. Token sums stay NULL until
 * something reports a number: NULL plus NULL is NULL, NULL plus a count is the count.
 */
export function addToKeyHour(columns: readonly KeyColumn[], select: string, shardSql: string): string {
  const add = (c: KeyColumn) =>
    NULLABLE.includes(c)
      ? `${c} = CASE WHEN EXCLUDED.${c} IS NULL THEN key_usage_hourly.${c} ELSE coalesce(key_usage_hourly.${c}, 0) + EXCLUDED.${c} END`
      : `${c} = key_usage_hourly.${c} + EXCLUDED.${c}`;
  return `INSERT INTO sarsen.key_usage_hourly (namespace_id, api_key_id, hour, shard, ${columns.join(', ')})
  SELECT namespace_id, api_key_id, date_trunc('hour', now()), (${shardSql})::int % ${KEY_SHARDS}, ${columns.join(', ')} FROM (${select}) AS added
  ON CONFLICT (namespace_id, hour, api_key_id, shard) DO UPDATE
    SET ${columns.map(add).join(', ')}`;
}
