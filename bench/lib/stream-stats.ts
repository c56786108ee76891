// Figures for the streaming benchmark: percentiles, the most intervals open at once, and a
// plain-text table.

/** Nearest-rank percentile of `values` (any order); NaN when empty. */
export function pct(values: readonly number[] | Float64Array, p: number): number {
  if (values.length === 0) return NaN;
  const sorted = Float64Array.from(values).sort();
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))]!;
}

/** The largest number of [start, end] intervals that overlap at one moment. */
export function maxOverlap(intervals: readonly (readonly [number, number])[]): number {
  const events: [number, number][] = [];
  for (const [a, b] of intervals) events.push([a, 1], [b, -1]);
  // Ends before starts at the same instant: touching intervals do not overlap.
  events.sort((x, y) => x[0] - y[0] || x[1] - y[1]);
  let open = 0;
  let most = 0;
  for (const [, d] of events) {
    open += d;
    most = Math.max(most, open);
  }
  return most;
}

export const ms = (n: number, digits = 2): string => (Number.isFinite(n) ? n.toFixed(digits) : '-');

/** Right-aligned columns under a header and a rule. */
export function textTable(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  return [line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(line)].join('\n');
}
