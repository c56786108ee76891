// `sarsen batch run INPUT.jsonl ...` (issue 18): a batch file in the shape batch APIs use
// (`{"custom_id", "body"}` per line) submitted through a Sarsen deployment's POST /requests,
// each body byte for byte as the file spells it, and the results collected by id into
// RESULTS.jsonl, in input order. It is an HTTP client of the service routes only: no
// database, no secrets. A state file beside the output maps each custom_id to its request_id
// as soon as it is accepted, so a run killed and started again submits nothing twice and
// collects what finished meanwhile.
import fs from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { ConfigError } from '../config/config.ts';
import { topLevelValueSpan } from '../core/json-span.ts';
import type { Flags, FlagValues } from '../core/flags.ts';

/** Its flags (src/cli/commands.ts parses them and prints them as its usage). */
export const BATCH_FLAGS = {
  'base-url': { type: 'string', value: 'URL', required: true, help: 'the namespace\'s service base, such as http://127.0.0.1:8080/acme/prod/v1' },
  'key-file': { type: 'string', value: 'FILE', required: true, help: 'a file holding a Sarsen API key with the use grant' },
  out: { type: 'string', value: 'RESULTS.jsonl', required: true, help: 'where the results go, in input order (RESULTS.jsonl.state beside it lets a run continue)' },
  dialect: { type: 'string', value: 'chat|messages|responses', default: 'chat', help: 'the route each body is sent to' },
  concurrency: { type: 'string', value: 'N', default: '16', help: 'requests in flight at once, 1 to 1024' },
  'skip-invalid': { type: 'boolean', help: 'sends the valid lines when some are not (else nothing is sent)' },
} as const satisfies Flags;
// Sarsen's submission limit (docs/api.md "Limits"): a larger body would be refused line by line.
const MAX_BODY_BYTES = 2 * 1024 * 1024;
const PATHS = { chat: '/v1/chat/completions', messages: '/v1/messages', responses: '/v1/responses' } as const;
type Dialect = keyof typeof PATHS;
const isBatchDialect = (d: string): d is Dialect => Object.hasOwn(PATHS, d);
// 429 and 503 from Sarsen itself are retried this many times, after Retry-After or a backoff.
const MAX_RETRIES = 10;
const POLL_MS = 500;

export type BatchLine = { line: number; customId: string; body: string; streaming: boolean };
type Result = { custom_id: string; request_id: string | null; status: 'succeeded' | 'failed'; response?: unknown; error?: unknown; error_status?: number };

/** The input's lines, and the problems of those that cannot be sent (by line number). */
export function readBatch(text: string, dialect: Dialect): { lines: BatchLine[]; problems: string[] } {
  const lines: BatchLine[] = [];
  const problems: string[] = [];
  const firstSeen = new Map<string, number>();
  text.split('\n').forEach((raw, i) => {
    const n = i + 1;
    if (raw.trim() === '') return;
    let v: unknown;
    try {
      v = JSON.parse(raw);
    } catch {
      return problems.push(`line ${n}: not JSON`);
    }
    if (v === null || typeof v !== 'object' || Array.isArray(v)) return problems.push(`line ${n}: not a JSON object`);
    const o = v as Record<string, unknown>;
    if (typeof o.custom_id !== 'string' || o.custom_id === '') return problems.push(`line ${n}: no custom_id`);
    const seen = firstSeen.get(o.custom_id);
    if (seen !== undefined) return problems.push(`line ${n}: duplicate custom_id ${JSON.stringify(o.custom_id)} (first on line ${seen})`);
    firstSeen.set(o.custom_id, n);
    if (o.method !== undefined && o.method !== 'POST') return problems.push(`line ${n}: method ${JSON.stringify(o.method)}; only POST`);
    if (o.url !== undefined && o.url !== PATHS[dialect]) return problems.push(`line ${n}: url ${JSON.stringify(o.url)} is not the ${dialect} dialect's ${PATHS[dialect]}`);
    if (o.body === null || typeof o.body !== 'object' || Array.isArray(o.body)) return problems.push(`line ${n}: no body object`);
    // Sent as written: re-serialised, 1.0 would become 1 and a long integer lose digits.
    const [start, end] = topLevelValueSpan(raw, 'body')!;
    const body = raw.slice(start, end);
    if (Buffer.byteLength(body) > MAX_BODY_BYTES) return problems.push(`line ${n}: body over 2 MiB`);
    lines.push({ line: n, customId: o.custom_id, body, streaming: (o.body as { stream?: unknown }).stream === true });
  });
  return { lines, problems };
}

/** The state file: custom_id -> request_id, one JSON line per accepted submission (a torn last line is ignored). */
function readState(file: string): Map<string, string> {
  const state = new Map<string, string>();
  if (!fs.existsSync(file)) return state;
  for (const raw of fs.readFileSync(file, 'utf8').split('\n')) {
    try {
      const { custom_id: c, request_id: r } = JSON.parse(raw) as { custom_id: unknown; request_id: unknown };
      if (typeof c === 'string' && typeof r === 'string') state.set(c, r);
    } catch {
      // an empty or torn line
    }
  }
  return state;
}

const parseJson = (text: string): unknown => {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
};

function retryDelayMs(header: string | null, attempt: number): number {
  const seconds = header === null ? NaN : Number(header);
  if (Number.isFinite(seconds) && seconds >= 0) return Math.min(seconds * 1000, 60_000);
  const date = header === null ? NaN : Date.parse(header);
  if (Number.isFinite(date)) return Math.min(Math.max(date - Date.now(), 0), 60_000);
  return Math.min(250 * 2 ** attempt, 10_000);
}

/** Runs `work` over `items` with at most `concurrency` at once. */
async function eachLimited<T>(items: readonly T[], concurrency: number, work: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < items.length) await work(items[next++]!);
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, items.length) }, worker));
}

type Client = { base: string; key: string; dialect: Dialect };

/** POST /requests, retrying Sarsen's own 429 and 503 (and a connection failure) after Retry-After. */
async function submit(c: Client, body: string): Promise<{ requestId: string } | { status: number; error: unknown }> {
  for (let attempt = 0; ; attempt++) {
    let res: Response;
    try {
      res = await fetch(`${c.base}/requests?dialect=${c.dialect}`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': c.key }, body });
    } catch (err) {
      // Sent again, an accepted body attaches to its request (idempotency): nothing runs twice.
      if (attempt < MAX_RETRIES) {
        await sleep(retryDelayMs(null, attempt));
        continue;
      }
      throw err;
    }
    const text = await res.text();
    if (res.status === 202) return { requestId: (JSON.parse(text) as { request_id: string }).request_id };
    if ((res.status === 429 || res.status === 503) && attempt < MAX_RETRIES) {
      await sleep(retryDelayMs(res.headers.get('retry-after'), attempt));
      continue;
    }
    return { status: res.status, error: parseJson(text) };
  }
}

/** The result of a settled request, or null while it runs. */
async function collect(c: Client, line: BatchLine, requestId: string): Promise<Result | null> {
  const headers = { 'x-sarsen-key': c.key };
  const res = await fetch(`${c.base}/requests/${requestId}`, { headers });
  const record = parseJson(await res.text()) as Record<string, unknown>;
  const base = { custom_id: line.customId, request_id: requestId };
  if (res.status !== 200) return { ...base, status: 'failed', error: record, error_status: res.status };
  if (record.status !== 'succeeded' && record.status !== 'failed') return null;
  if (record.status === 'failed') {
    return { ...base, status: 'failed', error: record.error, ...(typeof record.error_status === 'number' ? { error_status: record.error_status } : {}) };
  }
  if (!line.streaming) return { ...base, status: 'succeeded', response: record.response };
  // A streamed answer: its replay, without the `id:` lines Sarsen adds (the provider's frames).
  const replay = await fetch(`${c.base}/requests/${requestId}`, { headers: { ...headers, accept: 'text/event-stream' } });
  return { ...base, status: 'succeeded', response: (await replay.text()).replace(/^id: \d+\n/gm, '') };
}

type Progress = { total: number; submitted: number; succeeded: number; failed: number };

function progressLine(p: Progress, startedAt: number): string {
  const done = p.succeeded + p.failed;
  const seconds = (Date.now() - startedAt) / 1000;
  const rate = seconds > 0 ? done / seconds : 0;
  const left = rate > 0 ? Math.round((p.total - done) / rate) : null;
  const eta = left === null ? '?' : `${Math.floor(left / 60)}m${String(left % 60).padStart(2, '0')}s`;
  return `submitted ${p.submitted}/${p.total}  running ${p.submitted - done}  succeeded ${p.succeeded}  failed ${p.failed}  ${rate.toFixed(1)}/s  left ${eta}`;
}

function bar(p: Progress, width = 30): string {
  const filled = p.total === 0 ? width : Math.round(((p.succeeded + p.failed) / p.total) * width);
  return `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}]`;
}

export async function batchCommand(input: string, v: FlagValues<typeof BATCH_FLAGS>, out: (line: string) => void): Promise<number> {
  if (!isBatchDialect(v.dialect)) throw new ConfigError('--dialect must be chat, messages or responses');
  const concurrency = Number(v.concurrency);
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 1024) throw new ConfigError('--concurrency must be an integer from 1 to 1024');
  const client: Client = { base: v['base-url'].replace(/\/+$/, ''), key: fs.readFileSync(v['key-file'], 'utf8').trim(), dialect: v.dialect };

  const { lines, problems } = readBatch(fs.readFileSync(input, 'utf8'), client.dialect);
  for (const p of problems) out(p);
  if (problems.length > 0 && !v['skip-invalid']) {
    out(`${problems.length} invalid line(s); nothing was sent (--skip-invalid sends the others)`);
    return 2;
  }

  const stateFile = `${v.out}.state`;
  const state = readState(stateFile);
  const resumed = lines.filter((l) => state.has(l.customId)).length;
  if (resumed > 0) out(`resuming: ${resumed} line(s) already submitted (${stateFile})`);
  const stateOut = fs.openSync(stateFile, 'a');
  const results = new Map<string, Result>();
  const p: Progress = { total: lines.length, submitted: resumed, succeeded: 0, failed: 0 };
  const tty = process.stdout.isTTY === true;
  const startedAt = Date.now();
  let lastPlain = 0;
  const report = (final = false) => {
    if (tty) process.stdout.write(`\r\x1b[K${bar(p)} ${progressLine(p, startedAt)}${final ? '\n' : ''}`);
    else if (final || Date.now() - lastPlain >= 2000) {
      lastPlain = Date.now();
      out(progressLine(p, startedAt));
    }
  };
  const ticker = setInterval(report, tty ? 200 : 500);
  const settle = (r: Result) => {
    results.set(r.custom_id, r);
    if (r.status === 'succeeded') p.succeeded++;
    else p.failed++;
  };
  try {
    await eachLimited(
      lines.filter((l) => !state.has(l.customId)),
      concurrency,
      async (l) => {
        const s = await submit(client, l.body);
        if ('requestId' in s) {
          // Recorded before anything else: a run killed after this line never submits it again.
          fs.writeSync(stateOut, JSON.stringify({ custom_id: l.customId, request_id: s.requestId }) + '\n');
          state.set(l.customId, s.requestId);
          p.submitted++;
        } else settle({ custom_id: l.customId, request_id: null, status: 'failed', error: s.error, error_status: s.status });
      },
    );
    let waiting = lines.filter((l) => state.has(l.customId) && !results.has(l.customId));
    while (waiting.length > 0) {
      await eachLimited(waiting, concurrency, async (l) => {
        const r = await collect(client, l, state.get(l.customId)!);
        if (r) settle(r);
      });
      waiting = waiting.filter((l) => !results.has(l.customId));
      if (waiting.length > 0) await sleep(POLL_MS);
    }
  } finally {
    clearInterval(ticker);
    fs.closeSync(stateOut);
  }
  report(true);
  const text = lines.map((l) => JSON.stringify(results.get(l.customId)) + '\n').join('');
  fs.writeFileSync(`${v.out}.tmp`, text);
  fs.renameSync(`${v.out}.tmp`, v.out);
  out(`wrote ${lines.length} result(s) to ${v.out}: ${p.succeeded} succeeded, ${p.failed} failed`);
  return 0;
}
