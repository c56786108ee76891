// Per-table activity between two moments (pg_stat_user_tables and pg_stat_user_indexes):
// scans, tuples read, writes and dead tuples, to see which table's work the database's CPU
// goes to. The statistics are flushed by backends within ~10 s of going idle.
import type pg from 'pg';
import { fmt, table } from './stats.ts';

const COUNTERS = ['seq_scan', 'seq_tup_read', 'idx_scan', 'idx_tup_read', 'n_tup_ins', 'n_tup_upd', 'n_tup_hot_upd', 'n_tup_del'] as const;
type Counter = (typeof COUNTERS)[number];
type Row = Record<Counter | 'n_dead_tup' | 'n_live_tup', number>;
export type TableStats = Map<string, Row>;

export async function tableStats(pool: pg.Pool): Promise<TableStats> {
  const { rows } = await pool.query(
    `SELECT t.schemaname || '.' || t.relname AS name, t.seq_scan, t.seq_tup_read, coalesce(t.idx_scan, 0) AS idx_scan,
            coalesce((SELECT sum(i.idx_tup_read) FROM pg_stat_user_indexes i WHERE i.relid = t.relid), 0) AS idx_tup_read,
            t.n_tup_ins, t.n_tup_upd, t.n_tup_hot_upd, t.n_tup_del, t.n_dead_tup, t.n_live_tup
       FROM pg_stat_user_tables t WHERE t.schemaname IN ('sarsen', 'graphile_worker')`,
  );
  const numbers = (r: Record<string, unknown>) =>
    Object.fromEntries(Object.entries(r).filter(([k]) => k !== 'name').map(([k, v]) => [k, Number(v)])) as Row;
  return new Map(rows.map((r) => [r.name as string, numbers(r)]));
}

/** The busiest tables between two snapshots, counters per request. */
export function tableStatsReport(a: TableStats, b: TableStats, requests: number): string {
  const rows: { name: string; d: Record<Counter, number>; dead: number; live: number }[] = [];
  for (const [name, after] of b) {
    const before = a.get(name);
    const d = Object.fromEntries(COUNTERS.map((c) => [c, after[c] - (before?.[c] ?? 0)])) as Record<Counter, number>;
    if (COUNTERS.some((c) => d[c] !== 0)) rows.push({ name, d, dead: after.n_dead_tup, live: after.n_live_tup });
  }
  rows.sort((x, y) => y.d.seq_tup_read + y.d.idx_tup_read - (x.d.seq_tup_read + x.d.idx_tup_read));
  const per = (v: number) => fmt(v / requests, 2);
  return table(
    ['table', 'seq scans', 'seq tup read', 'idx scans', 'idx tup read', 'ins', 'upd', 'hot upd', 'del', 'dead now', 'live now'],
    rows.map((r) => [r.name, per(r.d.seq_scan), per(r.d.seq_tup_read), per(r.d.idx_scan), per(r.d.idx_tup_read), per(r.d.n_tup_ins), per(r.d.n_tup_upd), per(r.d.n_tup_hot_upd), per(r.d.n_tup_del), String(r.dead), String(r.live)]),
  );
}
