// Figures for benchmark reports: percentiles of latency samples and plain-text tables.

/** Nearest-rank percentile of `sorted` (ascending); NaN when there are no samples. */
export function percentile(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return NaN;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))]!;
}

/** The middle of `xs` (the mean of the two middle values for an even count); NaN when empty. */
export function median(xs: readonly number[]): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 === 1 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

export type Summary = { count: number; mean: number; p50: number; p90: number; p99: number; max: number };

/** Summary of latency samples in milliseconds (the input is not modified). */
export function summarise(samples: ArrayLike<number>): Summary {
  const sorted = Float64Array.from(samples).sort();
  let sum = 0;
  for (const v of sorted) sum += v;
  return {
    count: sorted.length,
    mean: sorted.length ? sum / sorted.length : NaN,
    p50: percentile(sorted, 50),
    p90: percentile(sorted, 90),
    p99: percentile(sorted, 99),
    max: sorted.length ? sorted[sorted.length - 1]! : NaN,
  };
}

/** A number with `digits` decimals, or "-" when it is not finite. */
export function fmt(n: number, digits = 1): string {
  return Number.isFinite(n) ? n.toFixed(digits) : '-';
}

/** Rows of cells as a right-aligned text table under a header row. */
export function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) => cells.map((c, i) => c.padStart(widths[i]!)).join('  ');
  const rule = widths.map((w) => '-'.repeat(w)).join('  ');
  return [line(header), rule, ...rows.map(line)].join('\n');
}

/** "met" / "MISSED (by how much)" for a figure against a target. */
export function verdict(value: number, target: number, better: 'higher' | 'lower', unit: string): string {
  if (Number.isNaN(value)) return 'not measured';
  if (!Number.isFinite(value)) return 'MISSED (nothing completed)';
  const met = better === 'higher' ? value >= target : value <= target;
  if (met) return 'met';
  const gap = better === 'higher' ? `${fmt((value / target) * 100, 0)}% of target` : `${fmt(value - target, 2)} ${unit} over`;
  return `MISSED (${gap})`;
}
