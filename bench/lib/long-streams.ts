// The long-streams phase of the side-by-side benchmark: many streams of many frames, paced as
// real LLM streams are, opened evenly over an arrival window and held at once, directly at the
// provider, through the gateway and through Sarsen. The provider (provider-process.ts
// --record) names each stream in its frames and keeps when it received each request and wrote
// each frame, on the epoch clock this process shares, so a frame's delay is measured exactly;
// every byte a caller receives is compared with what the provider wrote.
import http from 'node:http';
import os from 'node:os';
import crypto from 'node:crypto';
import type pg from 'pg';
import { frameText } from './stream-provider.ts';
import { treeCpuMs, sampleTreeRss } from './process-tree.ts';
import { machineCpuMs, serverCpuMs } from './cpu.ts';
import { summarise, fmt, table, verdict, type Summary } from './stats.ts';
import { assertLoopback } from './load.ts';

export type LongShape = { streams: number; frames: number; frameMs: number; arrivalMs: number };

export type LongSide = { name: string; url: string; headers: Record<string, string>; pid: number };

export type DbWrites = { rows: number; inserted: number; updated: number; deleted: number; relationBytes: number; walBytes: number };

export type LongResult = {
  name: string;
  started: number;
  completed: number;
  /** Streams whose every byte matched what the provider wrote, and nothing more. */
  byteExact: number;
  failures: string;
  /** Request sent to first frame complete at the caller. */
  ttff: Summary;
  /** Request sent to the request complete at the provider. */
  toProvider: Summary;
  /** Per pair of consecutive frames: the gap between their arrivals minus the gap between their writes. */
  gapAdded: Summary;
  /** Request sent to last frame complete at the caller. */
  duration: Summary;
  /** First frame written to last frame written, at the provider. */
  providerDuration: Summary;
  frames: number;
  cpuMs: number;
  pgCpuMs: number;
  /** Mean cores busy over the phase: the whole machine's, and this process's (the callers'). */
  machineCores: number;
  callerCores: number;
  wallMs: number;
  peakRssMb: number;
  writes: DbWrites | null;
};

type StreamTimes = { received: number; writes: number[] };
const epochMs = () => performance.timeOrigin + performance.now();

type OneStream = { tag: string; startedAt: number; arrivals: Float64Array; received: number; exact: boolean; error?: string };

/** One streaming POST whose bytes are checked against the frames the provider writes for `tag`, as they arrive. */
function longStream(agent: http.Agent, side: LongSide, tag: string, frames: number, timeoutMs: number): Promise<OneStream> {
  return new Promise((resolve) => {
    const body = `{"model":"gpt-bench","stream":true,"messages":[{"role":"user","content":"${tag}"}]}`;
    const arrivals = new Float64Array(frames).fill(NaN);
    const startedAt = epochMs();
    let index = 0; // the frame being received
    let offset = 0; // bytes of it received
    let expected = frameText(tag, 0, frames === 1);
    let exact = true;
    let settled = false;
    const done = (error?: string) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve({ tag, startedAt, arrivals, received: index, exact: exact && index === frames && offset === 0 && !error, ...(error ? { error } : {}) });
    };
    const req = http.request(
      side.url,
      { method: 'POST', agent, headers: { ...side.headers, accept: 'text/event-stream', 'content-length': String(Buffer.byteLength(body)) } },
      (res) => {
        if (res.statusCode !== 200) {
          res.resume();
          return done(`status ${res.statusCode}`);
        }
        res.setEncoding('latin1');
        res.on('data', (chunk: string) => {
          const now = epochMs();
          for (let at = 0; at < chunk.length; ) {
            if (index >= frames) {
              exact = false; // bytes after the last frame
              break;
            }
            const take = Math.min(expected.length - offset, chunk.length - at);
            if (exact && chunk.slice(at, at + take) !== expected.slice(offset, offset + take)) exact = false;
            at += take;
            offset += take;
            if (offset === expected.length) {
              arrivals[index++] = now;
              offset = 0;
              if (index < frames) expected = frameText(tag, index, index === frames - 1);
            }
          }
        });
        res.on('end', () => done(index === frames ? undefined : `ended after ${index} of ${frames} frames`));
        res.on('error', (err) => done(err.message));
      },
    );
    const timer = setTimeout(() => {
      req.destroy();
      done(`timed out after ${timeoutMs} ms with ${index} frames`);
    }, timeoutMs);
    req.on('error', (err) => done(err.message));
    req.end(body);
  });
}

async function providerTimes(providerUrl: string): Promise<Map<string, StreamTimes>> {
  const res = await fetch(`${providerUrl}/__bench/times`);
  return new Map(Object.entries((await res.json()) as Record<string, StreamTimes>));
}

/** Rows written (pg_stat_user_tables), relation bytes and WAL position of the database `pool` reaches. */
async function dbWritesNow(pool: pg.Pool): Promise<DbWrites> {
  const { rows } = await pool.query<{ ins: string; upd: string; del: string; bytes: string; wal: string }>(
    `SELECT coalesce(sum(n_tup_ins), 0) AS ins, coalesce(sum(n_tup_upd), 0) AS upd, coalesce(sum(n_tup_del), 0) AS del,
            coalesce(sum(pg_total_relation_size(relid)), 0) AS bytes, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0') AS wal
       FROM pg_stat_user_tables WHERE schemaname IN ('sarsen', 'graphile_worker')`,
  );
  const r = rows[0]!;
  const [inserted, updated, deleted] = [Number(r.ins), Number(r.upd), Number(r.del)];
  return { rows: inserted + updated + deleted, inserted, updated, deleted, relationBytes: Number(r.bytes), walBytes: Number(r.wal) };
}

/** Waits until the table statistics stop moving: busy backends report them at most once a second, idle ones within 10 s. */
async function settledDbWrites(pool: pg.Pool): Promise<DbWrites> {
  let last = await dbWritesNow(pool);
  for (let i = 0; i < 12; i++) {
    await new Promise((r) => setTimeout(r, 1_000));
    const now = await dbWritesNow(pool);
    if (now.rows === last.rows && i >= 1) return now;
    last = now;
  }
  return last;
}

const minus = (a: DbWrites, b: DbWrites): DbWrites => ({
  rows: a.rows - b.rows,
  inserted: a.inserted - b.inserted,
  updated: a.updated - b.updated,
  deleted: a.deleted - b.deleted,
  relationBytes: a.relationBytes - b.relationBytes,
  walBytes: a.walBytes - b.walBytes,
});

/**
 * Opens `shape.streams` streams evenly over `shape.arrivalMs` through `side`, waits for all of
 * them, and measures them against the provider's record. `db`: the database whose writes to
 * count (Sarsen's), and its postmaster for CPU.
 */
export async function runLongStreams(
  side: LongSide,
  providerUrl: string,
  shape: LongShape,
  opts: { postmaster: number | null; db?: pg.Pool; progress?: (line: string) => void },
): Promise<LongResult> {
  assertLoopback(new URL(side.url).origin);
  await providerTimes(providerUrl); // forget what an earlier side left
  const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity, maxFreeSockets: shape.streams });
  const run = crypto.randomBytes(3).toString('hex');
  const timeoutMs = shape.frames * shape.frameMs * 4 + shape.arrivalMs + 60_000;
  const writesBefore = opts.db ? await settledDbWrites(opts.db) : null;
  const cpu0 = treeCpuMs(side.pid);
  const pg0 = serverCpuMs(opts.postmaster);
  const machine0 = machineCpuMs().busy;
  const callers0 = process.cpuUsage();
  const wall0 = performance.now();
  const rss = sampleTreeRss(side.pid);
  let results: OneStream[];
  try {
    const t0 = performance.now();
    const pending: Promise<OneStream>[] = [];
    // Each stream starts at its moment in the window, however late the timer fires.
    await new Promise<void>((resolve) => {
      const tick = () => {
        const due = Math.min(shape.streams, Math.floor(((performance.now() - t0) / shape.arrivalMs) * shape.streams) + 1);
        while (pending.length < due) pending.push(longStream(agent, side, `${side.name}-${run}-${pending.length}`, shape.frames, timeoutMs));
        if (pending.length >= shape.streams) return resolve();
        setTimeout(tick, Math.max(1, shape.arrivalMs / shape.streams));
      };
      tick();
    });
    opts.progress?.(`${side.name}: all ${shape.streams} streams opened; waiting for them to end`);
    results = await Promise.all(pending);
  } finally {
    agent.destroy();
  }
  const cpuMs = treeCpuMs(side.pid) - cpu0;
  const pgCpuMs = serverCpuMs(opts.postmaster) - pg0;
  const wall = performance.now() - wall0;
  const machineCores = (machineCpuMs().busy - machine0) / wall;
  const callers = process.cpuUsage(callers0);
  const callerCores = (callers.user + callers.system) / 1000 / wall;
  const peakRssMb = rss.stop();
  const writes = opts.db && writesBefore ? minus(await settledDbWrites(opts.db), writesBefore) : null;
  const times = await providerTimes(providerUrl);

  const ok = results.filter((r) => r.received === shape.frames);
  const gaps = new Float64Array(ok.length * Math.max(0, shape.frames - 1));
  let g = 0;
  const toProvider: number[] = [];
  const providerDuration: number[] = [];
  for (const r of ok) {
    const t = times.get(r.tag);
    if (!t || t.writes.length !== shape.frames) continue;
    toProvider.push(t.received - r.startedAt);
    providerDuration.push(t.writes[shape.frames - 1]! - t.writes[0]!);
    for (let i = 1; i < shape.frames; i++) gaps[g++] = r.arrivals[i]! - r.arrivals[i - 1]! - (t.writes[i]! - t.writes[i - 1]!);
  }
  const failed = new Map<string, number>();
  for (const r of results) {
    const why = r.error ?? (r.exact ? null : 'bytes differ from the provider\'s');
    if (!why) continue;
    const kind = why.replace(/\d+ of/, 'N of').replace(/with \d+ frames/, 'with N frames');
    failed.set(kind, (failed.get(kind) ?? 0) + 1);
  }
  return {
    name: side.name,
    started: results.length,
    completed: ok.length,
    byteExact: results.filter((r) => r.exact).length,
    failures: failed.size === 0 ? 'none' : [...failed].map(([e, k]) => `${k}× ${e}`).join('; '),
    ttff: summarise(ok.map((r) => r.arrivals[0]! - r.startedAt)),
    toProvider: summarise(toProvider),
    gapAdded: summarise(gaps.subarray(0, g)),
    duration: summarise(ok.map((r) => r.arrivals[shape.frames - 1]! - r.startedAt)),
    providerDuration: summarise(providerDuration),
    frames: results.reduce((sum, r) => sum + r.received, 0),
    cpuMs,
    pgCpuMs,
    machineCores,
    callerCores,
    wallMs: wall,
    peakRssMb,
    writes,
  };
}

const per100k = (ms: number, frames: number) => (ms / 1000 / frames) * 100_000;

/** The phase's tables, and its rows of the targets table (Sarsen against direct and the gateway). */
export function longStreamsReport(results: LongResult[], shape: LongShape): { text: string; targets: string[][] } {
  const by = new Map(results.map((r) => [r.name, r]));
  const direct = by.get('direct');
  const gateway = by.get('gateway');
  const sarsen = by.get('sarsen');
  const nominal = ((shape.frames - 1) * shape.frameMs) / 1000;
  const lines = [
    `${shape.streams} streams of ${shape.frames} frames ${shape.frameMs} ms apart (${fmt(nominal, 2)} s at the provider), opened evenly over ${fmt(shape.arrivalMs / 1000, 1)} s; times in ms;`,
    'ttff = request to first frame, +ttff = minus direct\'s; to provider = request to its arrival there; gap+ = gap between two frames\' arrivals minus the gap between their writes',
    table(
      ['side', 'completed', 'byte-exact', 'ttff p50', 'p99', '+ttff p50', '+p99', 'to provider p50', 'p99', 'gap+ p50', 'p99', 'max', 'duration p50', 'p99', '× direct p50', 'failures'],
      results.map((r) => [
        r.name, `${r.completed}/${r.started}`, String(r.byteExact), fmt(r.ttff.p50, 1), fmt(r.ttff.p99, 1),
        r === direct ? '' : fmt(r.ttff.p50 - (direct?.ttff.p50 ?? NaN), 1), r === direct ? '' : fmt(r.ttff.p99 - (direct?.ttff.p99 ?? NaN), 1),
        fmt(r.toProvider.p50, 1), fmt(r.toProvider.p99, 1), fmt(r.gapAdded.p50, 2), fmt(r.gapAdded.p99, 2), fmt(r.gapAdded.max, 0),
        fmt(r.duration.p50, 0), fmt(r.duration.p99, 0), fmt(r.duration.p50 / (direct?.duration.p50 ?? NaN), 3), r.failures,
      ]),
    ),
    `the provider's own duration (first to last write) p50 / p99: ${results.map((r) => `${r.name} ${fmt(r.providerDuration.p50, 0)} / ${fmt(r.providerDuration.p99, 0)}`).join(', ')}`,
    '',
    `What it cost: CPU seconds per 100,000 frames delivered (the side's processes, for direct the provider's; the whole PostgreSQL server), peak RSS of the side's processes, the cores of the machine's ${os.cpus().length} busy over the phase (all of it; the callers', this process), and what Sarsen wrote to its database per frame`,
    table(
      ['side', 'frames', 'CPU s/100k', 'PostgreSQL s/100k', '× gateway (side)', '× gateway (side + PostgreSQL)', 'peak RSS MB', 'machine busy', 'callers'],
      results.map((r) => [
        r.name, String(r.frames), fmt(per100k(r.cpuMs, r.frames), 2), fmt(per100k(r.pgCpuMs, r.frames), 2),
        r === direct ? '' : fmt(per100k(r.cpuMs, r.frames) / per100k(gateway?.cpuMs ?? NaN, gateway?.frames ?? NaN), 2),
        r === direct ? '' : fmt(per100k(r.cpuMs + r.pgCpuMs, r.frames) / per100k((gateway?.cpuMs ?? NaN) + (gateway?.pgCpuMs ?? NaN), gateway?.frames ?? NaN), 2),
        fmt(r.peakRssMb, 0), fmt(r.machineCores, 2), fmt(r.callerCores, 2),
      ]),
    ),
  ];
  if (direct) {
    // What the provider and the callers leave of the machine while it keeps its pace: a proxy
    // keeps that pace only if it and its database spend less per frame (on average; at the
    // peak, when every stream is open, less still).
    const idleUsPerFrame = ((os.cpus().length - direct.machineCores) * direct.wallMs * 1000) / direct.frames;
    const spent = (r: LongResult | undefined) => (r ? `${fmt(((r.cpuMs + r.pgCpuMs) * 1000) / r.frames, 1)} µs` : 'not measured');
    lines.push(
      `The machine's CPU the direct run left idle: ${fmt(idleUsPerFrame, 1)} µs a frame (${fmt(os.cpus().length - direct.machineCores, 2)} cores at the provider's pace).` +
        ` A side keeps that pace only if it and PostgreSQL spend less a frame: Sarsen ${spent(sarsen)}, the gateway ${spent(gateway)},` +
        ` a bare Node relay that stores nothing ${spent(by.get('relay'))}.`,
    );
  }
  const w = sarsen?.writes;
  if (sarsen && w) {
    const f = sarsen.frames;
    lines.push(
      `Sarsen's database per frame: ${fmt(w.rows / f, 3)} rows written (${fmt(w.inserted / f, 3)} inserted, ${fmt(w.updated / f, 3)} updated, ${fmt(w.deleted / f, 3)} deleted; pg_stat_user_tables),` +
        ` tables and indexes grew ${fmt(w.relationBytes / f, 0)} bytes, WAL ${fmt(w.walBytes / f, 0)} bytes (the whole server's WAL over the phase)`,
    );
  }
  const n = shape.streams;
  const addedTtffP99 = (sarsen?.ttff.p99 ?? NaN) - (direct?.ttff.p99 ?? NaN);
  const durationRatio = (sarsen?.duration.p50 ?? NaN) / (direct?.duration.p50 ?? NaN);
  // Sarsen's processes and its PostgreSQL together, against the gateway's processes (it has no database).
  const cpuRatio = per100k((sarsen?.cpuMs ?? NaN) + (sarsen?.pgCpuMs ?? NaN), sarsen?.frames ?? NaN) / per100k(gateway?.cpuMs ?? NaN, gateway?.frames ?? NaN);
  const exact = sarsen?.byteExact ?? NaN;
  const targets = [
    [`${n} long streams: completed byte-exact`, `${n}`, String(exact), exact === n ? 'met' : sarsen ? 'MISSED' : 'not measured'],
    // Time to first frame is bounded by two cores shared with the provider and the callers:
    // shown without a target, and judged per core by bench:capacity.
    [`${n} long streams: added time to first frame p99 (ms)`, 'none', fmt(addedTtffP99, 1), 'see bench:capacity'],
    [`${n} long streams: duration p50, × the provider's (direct)`, '≤ 1.5', fmt(durationRatio, 3), verdict(durationRatio, 1.5, 'lower', '×')],
    [`${n} long streams: peak RSS`, '≤ 600 MB', fmt(sarsen?.peakRssMb ?? NaN, 0), verdict(sarsen?.peakRssMb ?? NaN, 600, 'lower', 'MB')],
    [`${n} long streams: CPU per 100,000 frames, Sarsen's processes and PostgreSQL's, × the gateway's`, '≤ 1.0', fmt(cpuRatio, 2), verdict(cpuRatio, 1, 'lower', '×')],
  ];
  return { text: lines.join('\n'), targets };
}
