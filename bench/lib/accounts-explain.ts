// The plans behind the accounts routes. The SQL is captured from src/db/accounting.ts itself
// (its functions are called against a recording stand-in for the pool), so the plans shown are
// of the statements the routes run, not of a copy that could drift from them.
import type pg from 'pg';
import type { Pool } from '../../src/db/pool.ts';

export type Captured = { text: string; values: unknown[] };

/** The statements `fn` sends, without running them (every query answers no rows). */
export async function captureSql(fn: (pool: Pool) => Promise<unknown>): Promise<Captured[]> {
  const seen: Captured[] = [];
  const recorder = {
    // Text and values, or a named statement's config object (see `prepared` in src/db/pool.ts).
    query: async (query: string | { text: string; values?: unknown[] }, values: unknown[] = []) => {
      seen.push(typeof query === 'string' ? { text: query, values } : { text: query.text, values: query.values ?? [] });
      return { rows: [], rowCount: 0 };
    },
  };
  await fn(recorder as unknown as Pool);
  return seen;
}

export type Plan = { lines: string[]; executionMs: number; planningMs: number; seqScans: string[]; rowsRead: number };

/** EXPLAIN (ANALYZE, BUFFERS) of one captured statement, and the tables it read sequentially. */
export async function explain(pool: pg.Pool, q: Captured): Promise<Plan> {
  const { rows } = await pool.query<{ 'QUERY PLAN': string }>(`EXPLAIN (ANALYZE, BUFFERS) ${q.text}`, q.values);
  const lines = rows.map((r) => r['QUERY PLAN']);
  const ms = (label: string) => Number(/([\d.]+) ms/.exec(lines.find((l) => l.startsWith(label)) ?? '')?.[1] ?? NaN);
  const seqScans = lines.flatMap((l) => /Seq Scan on (\S+)/.exec(l)?.[1] ?? []);
  return { lines, executionMs: ms('Execution Time'), planningMs: ms('Planning Time'), seqScans, rowsRead: rowsRead(lines) };
}

/** Rows the table scans returned (index-only bitmap steps aside): what the statement's cost grows with. */
function rowsRead(lines: string[]): number {
  let total = 0;
  for (const l of lines) {
    if (!/(Seq|Index|Index Only|Bitmap Heap) Scan/.test(l) || /Bitmap Index Scan/.test(l)) continue;
    const m = /actual time=[\d.]+\.\.[\d.]+ rows=(\d+) loops=(\d+)/.exec(l);
    if (m) total += Number(m[1]) * Number(m[2]);
  }
  return total;
}

/** The lines worth quoting: the plan nodes and the timing, not every buffer and filter line. */
export function keyLines(plan: Plan): string[] {
  return plan.lines.filter((l) => /(Scan|Join|Loop|Limit|Aggregate|Sort|Index Cond|Filter|Execution Time|Planning Time)/.test(l) && !/Sort Key|Sort Method/.test(l));
}
