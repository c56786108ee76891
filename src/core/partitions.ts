// Time partitions (docs/storage.md): where a partition's range starts and ends, which ones to
// create ahead, and which records the row-by-row sweep leaves to the drop of their partition.
// Pure: src/db/partitions.ts does the reading and writing.

export type Unit = 'day' | 'month';

const DAY_MS = 86_400_000;

/** The start (UTC) of the day or month `ms` falls in. */
export function floorTo(ms: number, unit: Unit): number {
  const d = new Date(ms);
  return unit === 'day' ? Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate()) : Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1);
}

/** The first day or month boundary after `ms`. */
export function nextBoundary(ms: number, unit: Unit): number {
  const d = new Date(floorTo(ms, unit));
  return unit === 'day' ? d.getTime() + DAY_MS : Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
}

/** A partition's name: its table and the day (YYYYMMDD) or month (YYYYMM) its range starts in. */
export function partitionName(table: string, lo: number, unit: Unit): string {
  const iso = new Date(lo).toISOString();
  return `${table}_p${iso.slice(0, 4)}${iso.slice(5, 7)}${unit === 'day' ? iso.slice(8, 10) : ''}`;
}

export type Range = { lo: number; hi: number };

/**
 * The ranges to create so that partitions reach `aheadMs` past `now`: from where the newest
 * ends (`lastHi`), one per day or month. A gap left by a long pause is covered by one partition
 * of its own, so no id a slow clock makes falls between partitions.
 */
export function rangesToCreate(lastHi: number, now: number, unit: Unit, aheadMs: number): Range[] {
  const out: Range[] = [];
  let lo = lastHi;
  const today = floorTo(now, unit);
  if (lo < today) {
    out.push({ lo, hi: today });
    lo = today;
  }
  while (lo < now + aheadMs) {
    const hi = nextBoundary(lo, unit);
    out.push({ lo, hi });
    lo = hi;
  }
  return out;
}

// Retiring by the drop lets a record outlive its horizon by up to a day (the width of a payload
// partition): accepted only against horizons of ten days and more. Shorter ones are swept row
// by row, exactly as before partitions.
export const DROP_MIN_HORIZON_MINUTES = 10 * 24 * 60;
// A partition still not dropped this long after it was due (a request that never finished, say)
// has its records swept row by row instead.
export const DROP_OVERDUE_MS = 2 * DAY_MS;

export type RowSweep = { everything: true } | { everything: false; belowMs: number };

/**
 * What the row-by-row sweep removes of a namespace whose effective horizon is `minutes`, when
 * the longest horizon of any namespace is `longest`:
 * - everything past the horizon when the horizon is shorter than the longest (its records share
 *   partitions with records kept longer), or when the longest is too short for the drop;
 * - otherwise the drop retires its records, and the row sweep takes only those it cannot reach
 *   in time: records made before `legacyHiMs` (the partition the migration attached, up to a
 *   horizon of records, held until its last one is due) and records whose partition is overdue.
 */
export function rowSweep(minutes: number, longest: number, now: number, legacyHiMs: number | null): RowSweep {
  if (minutes < longest || longest < DROP_MIN_HORIZON_MINUTES) return { everything: true };
  const overdue = now - minutes * 60_000 - DROP_OVERDUE_MS;
  return { everything: false, belowMs: Math.max(overdue, legacyHiMs ?? -Infinity) };
}
