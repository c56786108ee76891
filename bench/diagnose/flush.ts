// What one group-commit flush costs PostgreSQL by the size of its batch: the fixed part is what a
// request pays alone at low concurrency, twice (acceptance and the terminal write). The submission
// statement and the terminal write (src/db/submissions.ts, src/db/attempts.ts) run on one batch
// connection of a fresh database, nothing else running; lines fitted through the sizes split a
// flush into what it costs whatever its size and what each item adds.
//
//   --limited    a key whose rate limits are checked, never reached (src/db/rate-limits.ts)
//   --claim      accepted as role api does (pending), then claimed before the terminal write
//   --frames N   flushes of N running streams' frames (src/db/chunks.ts)
//   --days D     the partitions of a deployment D days old (docs/storage.md "Cost of many partitions")
//   --explain N  one flush of N under EXPLAIN ANALYZE: each writing part's share of time and WAL
//
// Run: node bench/diagnose/flush.ts [--sizes 1,4,16,64] [--items 1600] [--repeat 3] [--limited] [--claim] [--frames 100] [--days 90] [--explain 64]
import { benchDatabase } from '../lib/database.ts';
import { processCpuMs } from '../lib/cpu.ts';
import { fmt, median, percentile, table } from '../lib/stats.ts';
import { createTestDatabase, shutdownDatabases } from '../../test/support/db.ts';
import { createBatchPool, type Pool } from '../../src/db/pool.ts';
import { ENSURE_TASK_SQL } from '../../src/db/jobs.ts';
import { ensurePartitions, listPartitions, PAYLOADS, REQUESTS } from '../../src/db/partitions.ts';
import { submitBatch, isRefused, type NewRequest, type Submitted } from '../../src/db/submissions.ts';
import { claimAttempts, settleBatch, type Terminal } from '../../src/db/attempts.ts';
import { wholeFrame } from '../../src/core/frame-delta.ts';
import { storeFrames } from '../../src/db/chunks.ts';
import { newId } from '../../src/core/ids.ts';
import { benchArgs } from '../lib/args.ts';
import { explainParts } from './plan-parts.ts';
import type pg from 'pg';

const args = benchArgs({
  sizes: { type: 'string', default: '1,4,16,64' },
  // Items per size and repeat: small batches take more rounds.
  items: { type: 'string', default: '1600' },
  repeat: { type: 'string', default: '3' },
  limited: { type: 'boolean', default: false },
  claim: { type: 'boolean', default: false },
  frames: { type: 'string', default: '0' },
  days: { type: 'string', default: '0' },
  // A batch size to explain each statement at, after the measurements (0: none).
  explain: { type: 'string', default: '0' },
  'allow-non-durable': { type: 'boolean', default: false },
});
const SIZES = args.sizes.split(',').map(Number);
const ITEMS = Number(args.items);
const REPEAT = Number(args.repeat);
const EXPLAIN = Number(args.explain);
const DAYS = Number(args.days);
const CLAIM = args.claim;
const FRAMES = Number(args.frames);
const LIMITS = args.limited ? { requestsPerMinute: 1_000_000_000, tokensPerMinute: null } : null;
const out = (line = '') => process.stdout.write(line + '\n');

const SETTINGS = { windowMs: 600_000, feeMicros: 0, leaseMs: 30_000 };
const ANSWER = Buffer.from(JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'y'.repeat(300) } }], usage: { prompt_tokens: 50, completion_tokens: 70, total_tokens: 120 } }));

/** A distinct non-streaming chat submission of about 300 bytes, claimed by this process (as a process of role both claims what it accepts), or left pending (`--claim`). */
const submission = (): NewRequest => {
  const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: `${'x'.repeat(240)} ${newId('req')}` }] });
  return {
    id: newId('req'), tenancyId: 'ten_flush', namespaceId: 'ns_flush', apiKeyId: 'key_flush', backendId: 'bk_flush', fallbackBackendIds: [],
    dialect: 'chat', streaming: false, model: 'm', upstreamModel: 'm', forwardedHeaders: [], hops: 0, body,
    identity: Buffer.from(newId('req')), sealedCredential: null, owner: CLAIM ? null : 'wrk_flush', precounted: false, limits: LIMITS, cache: null,
  };
};

const success = (s: Submitted): Terminal => ({
  id: s.requestId, attempt: 1, model: 'm',
  answer: { status: 'succeeded', httpStatus: 200, contentType: 'application/json', body: ANSWER, errorStatus: null, retryAfter: null },
  tokens: { prompt: 50, completion: 70, total: 120 }, frames: null, reached: true, sentBytes: 300, receivedBytes: ANSWER.length,
  cancelled: false, end: { status: 200, retryAfter: null, error: null }, ownCredential: true, tokenLimited: false, cacheable: false,
});

/** The terminal writes of a batch just accepted, each a success. */
const successes = (accepted: Awaited<ReturnType<typeof submitBatch>>): Terminal[] =>
  accepted.map((a) => {
    if (a === null || isRefused(a)) throw new Error('a distinct submission was not accepted');
    return success(a);
  });

type Sample = { size: number; submitMs: number; claimMs: number; settleMs: number; backendUs: number; writerUs: number };

/** `rounds` flushes of `size` submissions, each followed by the terminal write of the same batch (claimed first with `--claim`). */
async function measure(pool: Pool, backend: number, size: number, rounds: number): Promise<Sample> {
  let submitNs = 0n;
  let claimNs = 0n;
  let settleNs = 0n;
  // This process's CPU from each statement's call to its answer: not the making of submissions.
  let writerUs = 0;
  const writer = (from: NodeJS.CpuUsage) => {
    const used = process.cpuUsage(from);
    writerUs += used.user + used.system;
  };
  const cpu0 = processCpuMs(backend);
  for (let i = 0; i < rounds; i++) {
    const batch = Array.from({ length: size }, submission);
    const own0 = process.cpuUsage();
    const t0 = process.hrtime.bigint();
    const accepted = await submitBatch(pool, batch, SETTINGS);
    const t1 = process.hrtime.bigint();
    writer(own0);
    const terminals = successes(accepted);
    if (CLAIM) {
      const own = process.cpuUsage();
      const t = process.hrtime.bigint();
      const claimed = await claimAttempts(pool, terminals.map((x) => x.id), 'wrk_flush', SETTINGS.leaseMs);
      claimNs += process.hrtime.bigint() - t;
      writer(own);
      if (claimed.size !== terminals.length) throw new Error('a pending submission was not claimed');
    }
    const own1 = process.cpuUsage();
    const t2 = process.hrtime.bigint();
    await settleBatch(pool, terminals, { metering: false, origin: 'wrk_flush' });
    settleNs += process.hrtime.bigint() - t2;
    writer(own1);
    submitNs += t1 - t0;
  }
  const items = size * rounds;
  return {
    size, submitMs: Number(submitNs) / 1e6 / rounds, claimMs: Number(claimNs) / 1e6 / rounds, settleMs: Number(settleNs) / 1e6 / rounds,
    backendUs: ((processCpuMs(backend) - cpu0) * 1000) / items, writerUs: writerUs / items,
  };
}

/** Flushes of one frame row for each of `streams` running requests, as the frame writer stores them. */
async function frameFlushes(pool: Pool, backend: number, streams: number): Promise<void> {
  const accepted = await submitBatch(pool, Array.from({ length: streams }, () => ({ ...submission(), streaming: true, owner: 'wrk_flush' })), SETTINGS);
  const ids = successes(accepted).map((t) => t.id);
  const frame = Buffer.from(`data: {"choices":[{"delta":{"content":"${'y'.repeat(40)}"}}]}\n\n`);
  const flushes = Math.max(50, Math.round((20 * ITEMS) / streams));
  const ms: number[] = [];
  const cpu0 = processCpuMs(backend);
  for (let seq = 1; seq <= flushes; seq++) {
    const t0 = process.hrtime.bigint();
    await storeFrames(pool, ids.map((requestId) => ({ requestId, attempt: 1, seq, frame, stored: wholeFrame(frame) })), 'wrk_flush');
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  const cpu = (processCpuMs(backend) - cpu0) / flushes;
  ms.sort((x, y) => x - y);
  out(`\nA flush of ${streams} frame rows (one a running request; ${flushes} flushes): ${fmt(percentile(ms, 50), 3)} ms at the median, the backend's CPU ${fmt(cpu, 3)} ms a flush`);
}

/** The statement `write` sends, caught instead of sent. */
async function statementOf(write: (db: Pool) => Promise<unknown>): Promise<pg.QueryConfig> {
  let caught: pg.QueryConfig | null = null;
  await write({ query: async (config: pg.QueryConfig) => ((caught = config), { rows: [] }) } as unknown as Pool);
  return caught!;
}

/** One flush of `size` of each statement under EXPLAIN ANALYZE, each writing part's time and WAL per item. */
async function explain(pool: Pool, size: number): Promise<void> {
  const accepted = await submitBatch(pool, Array.from({ length: size }, submission), SETTINGS);
  const statements = {
    submission: await statementOf((db) => submitBatch(db, Array.from({ length: size }, submission), SETTINGS)),
    terminal: await statementOf((db) => settleBatch(db, successes(accepted), { metering: false, origin: 'wrk_flush' })),
  };
  for (const [name, config] of Object.entries(statements)) {
    const e = await explainParts(pool, config);
    out(`\nThe ${name} statement at a batch of ${size}, under EXPLAIN ANALYZE (once; planning ${fmt(e.planningMs, 3)} ms, execution ${fmt(e.executionMs, 3)} ms):`);
    out(table(['part', 'µs per item', 'share', 'WAL records per item', 'WAL bytes per item'], e.parts.map((p) => [
      p.part, fmt((p.ms * 1000) / size, 1), `${fmt((100 * p.ms) / e.executionMs, 0)}%`, p.walRecords === null ? '' : fmt(p.walRecords / size, 1), p.walBytes === null ? '' : fmt(p.walBytes / size, 0),
    ])));
  }
}

/** Least squares through (size, ms): the intercept (a flush of nothing) and the slope (an item). */
function fit(points: readonly (readonly [number, number])[]): { fixed: number; perItem: number } {
  const n = points.length;
  const mx = points.reduce((s, [x]) => s + x, 0) / n;
  const my = points.reduce((s, [, y]) => s + y, 0) / n;
  const sxy = points.reduce((s, [x, y]) => s + (x - mx) * (y - my), 0);
  const sxx = points.reduce((s, [x]) => s + (x - mx) ** 2, 0);
  const perItem = sxx === 0 ? 0 : sxy / sxx;
  return { fixed: my - perItem * mx, perItem };
}

async function main(): Promise<void> {
  const server = await benchDatabase({ allowNonDurable: args['allow-non-durable'] });
  out(`Sarsen flush benchmark — ${new Date().toISOString()}`);
  out(`database: ${server.describe}`);
  out(`submissions: ${LIMITS ? 'each under a key with rate limits, checked and never reached' : 'under a key without rate limits'}`);
  const db = await createTestDatabase();
  // One connection, as one writer lane has: every statement is prepared (and planned) on it once.
  const pool = createBatchPool(db.conn, 'sarsen-flush-bench', 1);
  try {
    await pool.query(ENSURE_TASK_SQL);
    const tables = [...PAYLOADS.tables, ...REQUESTS.tables, 'ledger'];
    if (DAYS > 0) {
      for (const p of await listPartitions(pool, tables)) {
        await pool.query(`ALTER TABLE sarsen.${p.table} DETACH PARTITION sarsen.${p.name}`);
        await pool.query(`DROP TABLE sarsen.${p.name}`);
      }
      for (let t = Date.now() - DAYS * 86_400_000; t <= Date.now(); t += 86_400_000) await ensurePartitions(pool, t);
    }
    const partitions = await listPartitions(pool, tables);
    out(`partitions: ${tables.map((t) => `${t} ${partitions.filter((p) => p.table === t).length}`).join(', ')}${DAYS ? ` (a deployment ${DAYS} days old)` : ''}`);
    const backend = (await pool.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
    await measure(pool, backend, 4, 200);
    const samples: Sample[] = [];
    // Sizes in turn, repeated, so that the machine's drift weighs on every size alike.
    for (let r = 0; r < REPEAT; r++) {
      for (const size of SIZES) samples.push(await measure(pool, backend, size, Math.max(10, Math.round(ITEMS / size))));
    }
    const bySize = SIZES.map((size) => {
      const of = samples.filter((s) => s.size === size);
      return {
        size, submitMs: median(of.map((s) => s.submitMs)), claimMs: median(of.map((s) => s.claimMs)), settleMs: median(of.map((s) => s.settleMs)),
        backendUs: median(of.map((s) => s.backendUs)), writerUs: median(of.map((s) => s.writerUs)),
      };
    });
    const all = CLAIM ? 'all three statements' : 'both statements';
    out(`\nOne flush of each statement, as its writer waits for it (medians of ${REPEAT} runs; CPU of the database backend and of the writer, ${all}, per item${Number.isNaN(bySize[0]!.backendUs) ? '; the backend\'s is not readable, the server is not on this machine' : ''})`);
    const claimed = (cells: string[]) => (CLAIM ? cells : []);
    out(table(['batch', 'submission ms', '… per item µs', ...claimed(['claim ms']), 'terminal ms', '… per item µs', 'backend CPU µs per item', 'writer CPU µs per item'], bySize.map((b) => [
      String(b.size), fmt(b.submitMs, 3), fmt((b.submitMs * 1000) / b.size, 0), ...claimed([fmt(b.claimMs, 3)]), fmt(b.settleMs, 3), fmt((b.settleMs * 1000) / b.size, 0), fmt(b.backendUs, 0), fmt(b.writerUs, 0),
    ])));
    const submit = fit(bySize.map((b) => [b.size, b.submitMs]));
    const settle = fit(bySize.map((b) => [b.size, b.settleMs]));
    const cpu = fit(bySize.map((b) => [b.size, (b.backendUs * b.size) / 1000]));
    const writer = fit(bySize.map((b) => [b.size, (b.writerUs * b.size) / 1000]));
    out(`\nFitted: a submission flush ${fmt(submit.fixed, 3)} ms + ${fmt(submit.perItem * 1000, 0)} µs per item; a terminal flush ${fmt(settle.fixed, 3)} ms + ${fmt(settle.perItem * 1000, 0)} µs per item;`);
    out(`the backend's CPU for ${CLAIM ? 'all three' : 'both'}, ${fmt(cpu.fixed, 3)} ms + ${fmt(cpu.perItem * 1000, 0)} µs per item; the writer's, ${fmt(writer.fixed, 3)} ms + ${fmt(writer.perItem * 1000, 0)} µs per item.`);
    if (FRAMES > 0) await frameFlushes(pool, backend, FRAMES);
    if (EXPLAIN > 0) await explain(pool, EXPLAIN);
  } finally {
    await pool.end();
    await db.drop();
  }
}

main()
  .catch((err: unknown) => {
    process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exitCode = 1;
  })
  .finally(() => shutdownDatabases());
