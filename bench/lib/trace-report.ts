// Reading what Sarsen wrote with SARSEN_TRACE (src/trace.ts): every submission's milestones by
// request id, and its processes' GC pauses and event-loop stalls. Prints the slowest requests
// end to end, and where the time between milestones went for them against a median request.
import fs from 'node:fs';
import path from 'node:path';
import { fmt, table, percentile } from './stats.ts';

export type TraceWindow = { what: string; from: number; to: number };

type Stage = { stage: string; at: number; batch?: number };
type Traced = { id: string; pid: string; stages: Stage[] };
type Pause = { kind: string; pid: string; at: number; ms: number };

function read(prefix: string): { requests: Traced[]; pauses: Pause[] } {
  const dir = path.dirname(prefix);
  const base = path.basename(prefix);
  const byId = new Map<string, Traced>();
  const pauses: Pause[] = [];
  for (const name of fs.readdirSync(dir).filter((n) => n.startsWith(`${base}.`))) {
    const pid = name.slice(base.length + 1);
    for (const line of fs.readFileSync(path.join(dir, name), 'utf8').split('\n')) {
      const [id, stage, at, extra] = line.split(' ');
      if (!id || !stage || at === undefined) continue;
      if (id === '-') {
        pauses.push({ kind: stage, pid, at: Number(at), ms: Number(extra) });
        continue;
      }
      const t = byId.get(id) ?? { id, pid, stages: [] };
      t.stages.push({ stage, at: Number(at), ...(extra === undefined ? {} : { batch: Number(extra) }) });
      byId.set(id, t);
    }
  }
  for (const t of byId.values()) t.stages.sort((a, b) => a.at - b.at);
  return { requests: [...byId.values()], pauses };
}

const first = (t: Traced, stage: string) => t.stages.find((s) => s.stage === stage)?.at;
/** What the caller waited: arrival to the answer written. */
const waited = (t: Traced) => (first(t, 'answered') ?? NaN) - (first(t, 'arrived') ?? NaN);

/** Time between each milestone and the next, labelled by both. */
function segments(t: Traced): Map<string, number> {
  const m = new Map<string, number>();
  for (let i = 1; i < t.stages.length; i++) {
    const key = `${t.stages[i - 1]!.stage} → ${t.stages[i]!.stage}`;
    m.set(key, (m.get(key) ?? 0) + t.stages[i]!.at - t.stages[i - 1]!.at);
  }
  return m;
}

export function traceReport(prefix: string, windows: TraceWindow[], slowest = 20): string {
  const { requests, pauses } = read(prefix);
  const answered = requests.filter((t) => Number.isFinite(waited(t)));
  if (answered.length === 0) return `trace: no traced submission under ${prefix}`;
  const phaseOf = (at: number) => windows.find((w) => at >= w.from && at <= w.to)?.what ?? 'warm-up or between phases';
  const sorted = answered.sort((a, b) => waited(b) - waited(a));
  const lines = [`Traced submissions: ${answered.length} (files ${prefix}.<pid>); the ${Math.min(slowest, sorted.length)} slowest, arrival to answer written (ms after arrival; (n) = the batch's size):`];
  for (const t of sorted.slice(0, slowest)) {
    const t0 = first(t, 'arrived')!;
    const end = first(t, 'answered')!;
    const steps = t.stages.map((s) => `${s.stage} +${fmt(s.at - t0, 1)}${s.batch === undefined ? '' : ` (${s.batch})`}`).join(' | ');
    const during = pauses.filter((p) => p.pid === t.pid && p.at + p.ms >= t0 && p.at <= end).map((p) => `${p.kind} ${fmt(p.ms, 0)} ms at +${fmt(p.at - t0, 0)}`);
    lines.push(`  ${t.id} ${fmt(waited(t), 1)} ms, ${phaseOf(t0)}, process ${t.pid}: ${steps}${during.length ? `; pauses: ${during.join(', ')}` : ''}`);
  }

  // Where the slowest 1% spent their time, segment by segment, against the median request's.
  const tail = sorted.slice(0, Math.max(1, Math.ceil(sorted.length / 100)));
  const median = sorted[Math.floor(sorted.length / 2)]!;
  const totals = new Map<string, number[]>();
  for (const t of tail) for (const [k, ms] of segments(t)) totals.set(k, [...(totals.get(k) ?? []), ms]);
  const medianSegments = segments(median);
  const rows = [...totals]
    .map(([k, v]) => ({ k, share: v.reduce((a, b) => a + b, 0) / tail.reduce((a, t) => a + waited(t), 0), p50: percentile(v.sort((a, b) => a - b), 50), max: Math.max(...v), n: v.length }))
    .sort((a, b) => b.share - a.share);
  lines.push('', `The slowest 1% (${tail.length} requests, from ${fmt(waited(tail[tail.length - 1]!), 1)} ms) against the median request (${fmt(waited(median), 1)} ms), by segment:`);
  lines.push(table(['segment', 'requests', 'share of their time', 'p50 ms', 'max ms', 'median request ms'], rows.map((r) => [r.k, String(r.n), `${fmt(r.share * 100, 1)}%`, fmt(r.p50, 2), fmt(r.max, 1), fmt(medianSegments.get(r.k) ?? NaN, 2)])));
  const long = pauses.filter((p) => p.ms >= 50).sort((a, b) => b.ms - a.ms);
  const shown = long.slice(0, 20).map((p) => `${p.kind} ${fmt(p.ms, 0)} ms (${phaseOf(p.at)}, process ${p.pid})`);
  lines.push('', `Pauses of 50 ms or more in Sarsen's processes: ${long.length}${long.length ? `, the longest: ${shown.join('; ')}` : ''}`);
  return lines.join('\n');
}
