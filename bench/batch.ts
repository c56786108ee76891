// A 50,000-line batch through Sarsen (docs/performance.md "Targets"; docs/api.md "Batches"): how
// long the file takes to be accepted (POST /files, then POST /batches) and the server's peak RSS
// meanwhile against its idle RSS (target: within 64 MB, memory bounded by a constant, not the
// file); lines per second executed against the fake provider; and what synchronous callers on
// the same deployment see while the batch runs, against the same callers alone (target: p99 at
// most 1.5x alone). In one process that accepts and executes, dispatched lines yield to
// acceptance while the synchronous callers keep it busy (docs/durability.md "Acceptance first"),
// so the lines' rate is given overall and for the batch alone.
//
// Run: npm run bench:batch [-- --lines 50000 --sync-concurrency 4 --sync-seconds 10]
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import http from 'node:http';
import { performance } from 'node:perf_hooks';
import OpenAI from 'openai';
import { shutdownDatabases, testPool } from '../test/support/db.ts';
import { startFakeProvider } from '../test/support/fake-provider.ts';
import { startBenchSarsen } from './lib/sarsen-child.ts';
import { provisionChat } from './lib/provision.ts';
import { memoryMb, sampleRss } from './lib/stream-sarsen.ts';
import { summarise, fmt, table, verdict, type Summary } from './lib/stats.ts';
import { benchArgs } from './lib/args.ts';
import { benchDatabase } from './lib/database.ts';

const TARGETS = { acceptRssOverIdleMb: 64, syncP99Ratio: 1.5 };

const args = benchArgs({
  lines: { type: 'string', default: '50000' },
  'sync-concurrency': { type: 'string', default: '4' },
  'sync-seconds': { type: 'string', default: '10' },
  'in-flight': { type: 'string', default: '32' },
  // How long the batch may run before the bench reports what it did.
  'max-run-seconds': { type: 'string', default: '600' },
  'allow-non-durable': { type: 'boolean', default: false },
});
const LINES = Number(args.lines);
const SYNC_C = Number(args['sync-concurrency']);
const SYNC_MS = Number(args['sync-seconds']) * 1000;
const IN_FLIGHT = Number(args['in-flight']);
const MAX_RUN_MS = Number(args['max-run-seconds']) * 1000;

// A durable database, as every benchmark's (the test harness's embedded one has fsync off).
const database = await benchDatabase({ allowNonDurable: args['allow-non-durable'] });
console.log(`database: ${database.describe}`);
console.log(`batch bench: ${LINES} lines; batch_lines_in_flight ${IN_FLIGHT}; synchronous callers ${SYNC_C} for ${SYNC_MS / 1000} s alone and while the batch runs; ${os.cpus().length} CPUs (shared)`);

const provider = await startFakeProvider();
const sarsen = await startBenchSarsen({ settings: { batch_lines_in_flight: IN_FLIGHT, batch_max_lines: Math.max(LINES, 50_000) } });
const pool = testPool(sarsen.db.conn);
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-batch-bench-'));
try {
  const t = await provisionChat(sarsen.url, pool, provider.url);
  const base = `${sarsen.url}${t.basePath}`;
  const client = new OpenAI({ baseURL: base, apiKey: t.key, maxRetries: 0, timeout: 600_000 });
  const pid = sarsen.child.child.pid!;
  const agent = new http.Agent({ keepAlive: true, maxSockets: SYNC_C });

  /** One synchronous chat call; answers its latency in ms. */
  let n = 0;
  const syncCall = () =>
    new Promise<number>((resolve, reject) => {
      const body = JSON.stringify({ model: 'gpt-bench', messages: [{ role: 'user', content: `sync ${process.pid} ${++n}` }] });
      const started = performance.now();
      const req = http.request(`${base}/chat/completions`, { method: 'POST', agent, headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key } }, (res) => {
        res.resume();
        res.on('end', () => (res.statusCode === 200 ? resolve(performance.now() - started) : reject(new Error(`status ${res.statusCode}`))));
      });
      req.on('error', reject);
      req.end(body);
    });
  const syncLoad = async (ms: number): Promise<Summary> => {
    const samples: number[] = [];
    const until = performance.now() + ms;
    await Promise.all(Array.from({ length: SYNC_C }, async () => {
      while (performance.now() < until) samples.push(await syncCall());
    }));
    return summarise(samples);
  };

  // Warm up, then the synchronous callers alone.
  await syncLoad(2000);
  const alone = await syncLoad(SYNC_MS);

  // The input, written to disk and streamed from there: the bench holds no copy either.
  const file = path.join(dir, 'input.jsonl');
  const out = fs.createWriteStream(file);
  for (let i = 0; i < LINES; i++) {
    const line = JSON.stringify({ custom_id: `line-${i}`, method: 'POST', url: '/v1/chat/completions', body: { model: 'gpt-bench', messages: [{ role: 'user', content: `batch line ${i} of the bench, a few words to make it a realistic size` }] } });
    if (!out.write(`${line}\n`)) await new Promise<void>((r) => out.once('drain', () => r()));
  }
  await new Promise<void>((r) => out.end(() => r()));
  const fileMb = fs.statSync(file).size / 1024 / 1024;

  const idle = memoryMb(pid).rss;
  const rss = sampleRss(pid, 20);
  const acceptStart = performance.now();
  const uploaded = await client.files.create({ file: fs.createReadStream(file), purpose: 'batch' });
  const uploadMs = performance.now() - acceptStart;
  const batch = await client.batches.create({ input_file_id: uploaded.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  const acceptMs = performance.now() - acceptStart;
  const peak = rss.stop();
  if (batch.status !== 'in_progress') throw new Error(`the batch is ${batch.status}: ${JSON.stringify(batch.errors)}`);

  // The synchronous callers again, while the batch runs.
  const runStart = performance.now();
  const during = await syncLoad(SYNC_MS);
  const doneDuring = (await client.batches.retrieve(batch.id)).request_counts!.completed;
  const aloneStart = performance.now();

  let status = batch.status as string;
  let completed = 0;
  while (performance.now() - runStart < MAX_RUN_MS) {
    const b = await client.batches.retrieve(batch.id);
    status = b.status;
    completed = b.request_counts!.completed;
    if (status === 'completed' || status === 'failed' || status === 'cancelled' || status === 'expired') break;
    if (process.env.BENCH_PROGRESS) console.log(`${fmt((performance.now() - runStart) / 1000)} s: ${completed} completed`);
    await new Promise((r) => setTimeout(r, 500));
  }
  const runS = (performance.now() - runStart) / 1000;
  const aloneS = (performance.now() - aloneStart) / 1000;
  agent.destroy();

  const over = peak - idle;
  const ratio = during.p99 / alone.p99;
  console.log(`\ninput: ${LINES} lines, ${fmt(fileMb)} MB`);
  console.log(table(['figure', 'value', 'target', 'verdict'], [
    ['upload (POST /files)', `${fmt(uploadMs / 1000, 2)} s`, '', ''],
    ['accept (upload + POST /batches)', `${fmt(acceptMs / 1000, 2)} s`, '', ''],
    ['server RSS idle / peak while accepting', `${fmt(idle)} / ${fmt(peak)} MB`, '', ''],
    ['peak RSS over idle', `${fmt(over)} MB`, `<= ${TARGETS.acceptRssOverIdleMb} MB`, verdict(over, TARGETS.acceptRssOverIdleMb, 'lower', 'MB')],
    ['lines executed', `${completed} of ${LINES} (${status}) in ${fmt(runS)} s`, '', ''],
    ['lines per second, overall', fmt(completed / runS), '', ''],
    ['lines per second, the batch alone', fmt((completed - doneDuring) / aloneS), '', ''],
    [`lines done while synchronous callers ran (${SYNC_MS / 1000} s)`, String(doneDuring), '', ''],
    ['synchronous p50 alone / during', `${fmt(alone.p50, 2)} / ${fmt(during.p50, 2)} ms`, '', ''],
    ['synchronous p99 alone / during', `${fmt(alone.p99, 2)} / ${fmt(during.p99, 2)} ms`, '', ''],
    ['synchronous p99 during / alone', `${fmt(ratio, 2)}x`, `<= ${TARGETS.syncP99Ratio}x`, verdict(ratio, TARGETS.syncP99Ratio, 'lower', 'x')],
    ['synchronous calls alone / during', `${alone.count} / ${during.count}`, '', ''],
  ]));
} finally {
  fs.rmSync(dir, { recursive: true, force: true });
  await pool.end();
  await sarsen.stop();
  await provider.close();
  await shutdownDatabases();
}
