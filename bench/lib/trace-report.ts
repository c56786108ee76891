// Where a request's time went (`bench:compare --trace`), read from the spans Sarsen exports
// (docs/operations.md "Tracing"): the benchmark receives them over OTLP/HTTP JSON, keeps each
// request's milestones by trace, and each process's GC pauses and event-loop stalls. It prints the
// slowest requests end to end, where the time between milestones went for them against a median
// request, and the pauses of each measured phase.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { decodeSpans, type ExportedSpan } from '../../test/support/otlp-receiver.ts';
import { fmt, table, percentile } from './stats.ts';

export type TraceWindow = { what: string; from: number; to: number };

export type Stage = { stage: string; at: number; batch?: number };
export type Timeline = { id: string | null; pid: string; stages: Stage[] };
export type Pause = { kind: string; pid: string; at: number; ms: number };

const SERVER = 2;
const CLIENT = 3;
const ms = (ns: bigint): number => Number(ns / 1000n) / 1000;

/** The milestones one span marks (epoch ms), the request id it names, or the pause it is. */
export function milestonesOf(s: ExportedSpan): { id?: string; stages: Stage[]; pause?: Pause } {
  const pid = String(s.resource['process.pid'] ?? '?');
  const id = typeof s.attributes['sarsen.request.id'] === 'string' ? s.attributes['sarsen.request.id'] : undefined;
  const batch = typeof s.attributes['sarsen.group_commit.batch_size'] === 'number' ? s.attributes['sarsen.group_commit.batch_size'] : undefined;
  const event = (name: string, stage: string, withBatch = false): Stage[] =>
    s.events.filter((e) => e.name === name).slice(0, 1).map((e) => ({ stage, at: ms(e.timeNs), ...(withBatch && batch !== undefined ? { batch } : {}) }));
  if (s.name === 'sarsen.gc' || s.name === 'sarsen.event_loop.stall') {
    return { stages: [], pause: { kind: s.name === 'sarsen.gc' ? 'gc' : 'stall', pid, at: ms(s.startNs), ms: ms(s.endNs) - ms(s.startNs) } };
  }
  if (s.kind === SERVER) return id === undefined ? { stages: [] } : { id, stages: [{ stage: 'arrived', at: ms(s.startNs) }, { stage: 'answered', at: ms(s.endNs) }] };
  if (s.name === 'sarsen.accept') {
    return { id, stages: [{ stage: 'submit', at: ms(s.startNs) }, ...event('sarsen.group_commit.flush', 'accept_flush', true), ...event('sarsen.group_commit.committed', 'accept_commit')] };
  }
  if (s.name === 'sarsen.attempt') return { id, stages: [{ stage: 'claimed', at: ms(s.startNs) }, ...event('sarsen.yielded', 'yielded')] };
  if (s.kind === CLIENT) {
    return {
      stages: [
        { stage: 'provider_call', at: ms(s.startNs) }, ...event('sarsen.first_frame', 'first_frame'), ...event('sarsen.first_frame_committed', 'first_frame_commit'),
        { stage: 'provider_done', at: ms(s.endNs) },
      ],
    };
  }
  if (s.name === 'sarsen.settle') return { stages: [...event('sarsen.group_commit.flush', 'terminal_flush', true), ...event('sarsen.group_commit.committed', 'terminal_commit')] };
  return { stages: [] };
}

/** Each trace's milestones in time order, and the pauses, from spans as they arrive. */
export function createTimelines() {
  const byTrace = new Map<string, Timeline>();
  const pauses: Pause[] = [];
  return {
    add(spans: readonly ExportedSpan[]): void {
      for (const s of spans) {
        const m = milestonesOf(s);
        if (m.pause) pauses.push(m.pause);
        if (m.stages.length === 0) continue;
        let t = byTrace.get(s.traceId);
        if (!t) byTrace.set(s.traceId, (t = { id: null, pid: String(s.resource['process.pid'] ?? '?'), stages: [] }));
        if (m.id !== undefined) t.id = m.id;
        t.stages.push(...m.stages);
      }
    },
    timelines(): Timeline[] {
      const all = [...byTrace.values()];
      for (const t of all) t.stages.sort((a, b) => a.at - b.at);
      return all;
    },
    pauses: (): Pause[] => pauses,
  };
}

export type SpanCollector = {
  /** What a Sarsen child needs in its environment to export every span here. */
  env: Record<string, string>;
  report(windows: TraceWindow[], slowest?: number): string;
  close(): Promise<void>;
};

/** An OTLP/HTTP JSON receiver on 127.0.0.1 that keeps only the milestones. */
export async function startSpanCollector(): Promise<SpanCollector> {
  const kept = createTimelines();
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      if (req.url === '/v1/traces') kept.add(decodeSpans(Buffer.concat(chunks).toString('utf8')));
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    // Every span sampled and none dropped from a full queue: a run's whole load is traced.
    env: {
      OTEL_EXPORTER_OTLP_ENDPOINT: url, OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json', OTEL_TRACES_SAMPLER: 'always_on',
      OTEL_BSP_SCHEDULE_DELAY: '500', OTEL_BSP_MAX_QUEUE_SIZE: '200000', OTEL_BSP_MAX_EXPORT_BATCH_SIZE: '4096',
    },
    report: (windows, slowest) => traceReport(kept.timelines(), kept.pauses(), windows, slowest),
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

const first = (t: Timeline, stage: string) => t.stages.find((s) => s.stage === stage)?.at;
/** What the caller waited: arrival to the answer written. */
const waited = (t: Timeline) => (first(t, 'answered') ?? NaN) - (first(t, 'arrived') ?? NaN);

/** Time between each milestone and the next, labelled by both. */
function segments(t: Timeline): Map<string, number> {
  const m = new Map<string, number>();
  for (let i = 1; i < t.stages.length; i++) {
    const key = `${t.stages[i - 1]!.stage} → ${t.stages[i]!.stage}`;
    m.set(key, (m.get(key) ?? 0) + t.stages[i]!.at - t.stages[i - 1]!.at);
  }
  return m;
}

export function traceReport(requests: Timeline[], pauses: Pause[], windows: TraceWindow[], slowest = 20): string {
  const answered = requests.filter((t) => Number.isFinite(waited(t)));
  if (answered.length === 0) return 'trace: no traced submission arrived';
  const phaseOf = (at: number) => windows.find((w) => at >= w.from && at <= w.to)?.what ?? 'warm-up or between phases';
  const sorted = answered.sort((a, b) => waited(b) - waited(a));
  const lines = [`Traced submissions: ${answered.length}; the ${Math.min(slowest, sorted.length)} slowest, arrival to answer written (ms after arrival; (n) = the batch's size):`];
  for (const t of sorted.slice(0, slowest)) {
    const t0 = first(t, 'arrived')!;
    const end = first(t, 'answered')!;
    const steps = t.stages.map((s) => `${s.stage} +${fmt(s.at - t0, 1)}${s.batch === undefined ? '' : ` (${s.batch})`}`).join(' | ');
    const during = pauses.filter((p) => p.pid === t.pid && p.at + p.ms >= t0 && p.at <= end).map((p) => `${p.kind} ${fmt(p.ms, 0)} ms at +${fmt(p.at - t0, 0)}`);
    lines.push(`  ${t.id ?? '?'} ${fmt(waited(t), 1)} ms, ${phaseOf(t0)}, process ${t.pid}: ${steps}${during.length ? `; pauses: ${during.join(', ')}` : ''}`);
  }

  // Where the slowest 1% spent their time, segment by segment, against the median request's.
  const tail = sorted.slice(0, Math.max(1, Math.ceil(sorted.length / 100)));
  const median = sorted[Math.floor(sorted.length / 2)]!;
  const totals = new Map<string, number[]>();
  for (const t of tail) for (const [k, v] of segments(t)) totals.set(k, [...(totals.get(k) ?? []), v]);
  const medianSegments = segments(median);
  const rows = [...totals]
    .map(([k, v]) => ({ k, share: v.reduce((a, b) => a + b, 0) / tail.reduce((a, t) => a + waited(t), 0), p50: percentile(v.sort((a, b) => a - b), 50), max: Math.max(...v), n: v.length }))
    .sort((a, b) => b.share - a.share);
  lines.push('', `The slowest 1% (${tail.length} requests, from ${fmt(waited(tail[tail.length - 1]!), 1)} ms) against the median request (${fmt(waited(median), 1)} ms), by segment:`);
  lines.push(table(['segment', 'requests', 'share of their time', 'p50 ms', 'max ms', 'median request ms'], rows.map((r) => [r.k, String(r.n), `${fmt(r.share * 100, 1)}%`, fmt(r.p50, 2), fmt(r.max, 1), fmt(medianSegments.get(r.k) ?? NaN, 2)])));
  // Every pause a process recorded (src/telemetry/pauses.ts: collections from 5 ms, stalls of the
  // loop from 20), by measured phase: each holds every live request and stream of its process at once.
  const inPhases = windows.flatMap((w) =>
    (['gc', 'stall'] as const).flatMap((kind) => {
      const ms = pauses.filter((p) => p.kind === kind && p.at >= w.from && p.at <= w.to).map((p) => p.ms).sort((a, b) => a - b);
      return ms.length === 0 ? [] : [[w.what, kind, String(ms.length), fmt((w.to - w.from) / 1000 / ms.length, 1), fmt(percentile(ms, 50), 1), fmt(ms[ms.length - 1]!, 1)]];
    }),
  );
  if (inPhases.length > 0) {
    lines.push('', 'Pauses in the measured phases (collections of 5 ms or more, stalls of the event loop of 20 ms or more):');
    lines.push(table(['phase', 'kind', 'pauses', 'one every s', 'p50 ms', 'max ms'], inPhases));
  }
  const long = pauses.filter((p) => p.ms >= 50).sort((a, b) => b.ms - a.ms);
  const shown = long.slice(0, 20).map((p) => `${p.kind} ${fmt(p.ms, 0)} ms (${phaseOf(p.at)}, process ${p.pid})`);
  lines.push('', `Pauses of 50 ms or more in Sarsen's processes: ${long.length}${long.length ? `, the longest: ${shown.join('; ')}` : ''}`);
  return lines.join('\n');
}
