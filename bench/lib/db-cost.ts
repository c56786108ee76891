// What one database's work cost between two moments: rows written and transactions committed
// (pg_stat_database), statements executed (pg_stat_statements, when loaded; NaN otherwise) and
// WAL written (pg_current_wal_lsn: the whole server's, so nothing else should write meanwhile).
// Read from another database of the same server, so the readings are not counted themselves.
// Backends report rows and commits at most once a second, so a reading waits until they stop moving.
import type pg from 'pg';

export type DbCost = { rows: number; inserted: number; updated: number; deleted: number; commits: number; statements: number; walBytes: number };

async function now(pool: pg.Pool, database: string): Promise<DbCost> {
  const { rows } = await pool.query<{ ins: string; upd: string; del: string; commits: string; wal: string }>(
    `SELECT tup_inserted AS ins, tup_updated AS upd, tup_deleted AS del, xact_commit AS commits,
            pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0') AS wal
       FROM pg_stat_database WHERE datname = $1`,
    [database],
  );
  const r = rows[0];
  if (!r) throw new Error(`no statistics for database ${database}`);
  let statements = NaN;
  try {
    const s = await pool.query<{ calls: string }>(
      `SELECT coalesce(sum(calls), 0) AS calls FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)`,
      [database],
    );
    statements = Number(s.rows[0]!.calls);
  } catch {
    // pg_stat_statements is not loaded on this server
  }
  const [inserted, updated, deleted] = [Number(r.ins), Number(r.upd), Number(r.del)];
  return { rows: inserted + updated + deleted, inserted, updated, deleted, commits: Number(r.commits), statements, walBytes: Number(r.wal) };
}

/**
 * A reading once the counters stopped moving: two readings a second apart that differ by no more
 * than an idle proxy's housekeeping (a few commits); at most 12 s.
 */
export async function settledDbCost(pool: pg.Pool, database: string): Promise<DbCost> {
  let last = await now(pool, database);
  for (let i = 0; i < 12; i++) {
    await new Promise((r) => setTimeout(r, 1_000));
    const next = await now(pool, database);
    if (next.rows - last.rows <= 5 && next.commits - last.commits <= 5) return next;
    last = next;
  }
  return last;
}

export function costBetween(a: DbCost, b: DbCost): DbCost {
  return {
    rows: b.rows - a.rows, inserted: b.inserted - a.inserted, updated: b.updated - a.updated, deleted: b.deleted - a.deleted,
    commits: b.commits - a.commits, statements: b.statements - a.statements, walBytes: b.walBytes - a.walBytes,
  };
}

/** Per statement (pg_stat_statements): calls, rows and WAL bytes so far, and time spent executing in ms. */
export type StatementCounts = Map<string, { query: string; calls: number; rows: number; walBytes: number; execMs: number }>;

/** Every statement's counters for `database` (empty when pg_stat_statements is not loaded). */
export async function statementCounts(pool: pg.Pool, database: string): Promise<StatementCounts> {
  try {
    const { rows } = await pool.query<{ id: string; query: string; calls: string; rows: string; wal: string; ms: number }>(
      `SELECT queryid::text AS id, query, calls, rows, wal_bytes AS wal, total_exec_time AS ms
         FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)`,
      [database],
    );
    return new Map(rows.map((r) => [r.id, { query: r.query, calls: Number(r.calls), rows: Number(r.rows), walBytes: Number(r.wal), execMs: Number(r.ms) }]));
  } catch {
    return new Map();
  }
}

/** The statements run most between two readings, `top` of them, with their figures per unit of work (`n` requests or frames). */
export function busiestStatements(a: StatementCounts, b: StatementCounts, n: number, top = 8): { query: string; perUnit: number; rowsPerCall: number; walPerCall: number; meanMs: number }[] {
  const rows = [];
  for (const [id, after] of b) {
    const before = a.get(id);
    const calls = after.calls - (before?.calls ?? 0);
    if (calls <= 0) continue;
    rows.push({
      query: after.query.replace(/\s+/g, ' ').trim(),
      perUnit: calls / n,
      rowsPerCall: (after.rows - (before?.rows ?? 0)) / calls,
      walPerCall: (after.walBytes - (before?.walBytes ?? 0)) / calls,
      meanMs: (after.execMs - (before?.execMs ?? 0)) / calls,
    });
  }
  return rows.sort((x, y) => y.perUnit - x.perUnit).slice(0, top);
}
