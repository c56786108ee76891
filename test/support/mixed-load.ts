// A mixed load over one or more api processes, as callers behind a load balancer send it:
// synchronous and streaming calls, fire-and-forget submissions (POST /requests), identical
// bodies sent at once to two processes, and replays by id from a process other than the one
// that accepted. Every body carries a marker, and the fake provider answers each marker with
// bytes that are a pure function of it, so every answer and every replay is checked byte for
// byte, and `verifyStored` checks afterwards that every request ended once, with one provider
// call per attempt.
import crypto from 'node:crypto';
import type pg from 'pg';
import type { FakeProvider } from './fake-provider.ts';

export type LoadTenant = { tenancy: string; namespace: string; key: string };
export type OpKind = 'sync' | 'stream' | 'submit' | 'submit-stream' | 'duplicate' | 'replay';
export type StreamEnd = 'finished' | 'superseded' | 'reset' | 'mismatch';

export type Op = { kind: OpKind; api: number; startedAt: number; endedAt: number; status: number; detail?: string; stream?: StreamEnd; retryAfter?: string };
export type Accepted = { id: string; marker: string; streaming: boolean; api: number; at: number };

export type LoadSummary = {
  ops: Op[];
  accepted: Accepted[];
  /** Byte comparisons that failed, and requests that failed outright (network errors). */
  mismatches: string[];
  errors: string[];
};

const MIX: readonly [OpKind, number][] = [['sync', 30], ['stream', 20], ['submit', 15], ['submit-stream', 10], ['duplicate', 10], ['replay', 15]];
const FRAMES = 6;

/** The provider's non-streaming answer to `marker`, byte for byte. */
export const expectedJson = (marker: string): string =>
  JSON.stringify({ id: `chatcmpl-${marker}`, object: 'chat.completion', model: 'gpt-load', choices: [{ index: 0, message: { role: 'assistant', content: `answer ${marker}` }, finish_reason: 'stop' }], usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 } });

/** The provider's stream for `marker`, frame by frame. */
export const expectedFrames = (marker: string): string[] => [
  ...Array.from({ length: FRAMES }, (_, i) => `data: {"id":"chatcmpl-${marker}","object":"chat.completion.chunk","model":"gpt-load","choices":[{"index":0,"delta":{"content":"w${i} "}}]}\n\n`),
  'data: [DONE]\n\n',
];

const markerOf = (body: unknown): string | null => {
  const content = (body as { messages?: { content?: unknown }[] } | null)?.messages?.[0]?.content;
  return typeof content === 'string' && content.startsWith('m-') ? content : null;
};

/** Makes the fake provider answer load bodies (streams `frameDelayMs` apart); returns how to stop. */
export function answerLoad(provider: FakeProvider, frameDelayMs = 20): () => void {
  return provider.rule((e) => {
    const marker = markerOf(e.json);
    if (marker === null) return undefined;
    return e.json.stream === true ? { kind: 'sse', frames: expectedFrames(marker), frameDelayMs } : { kind: 'json', body: expectedJson(marker) };
  });
}

/** Provider calls per marker so far. */
export function callsByMarker(provider: FakeProvider): Map<string, number> {
  const calls = new Map<string, number>();
  for (const e of provider.journal) {
    const m = markerOf(e.json);
    if (m) calls.set(m, (calls.get(m) ?? 0) + 1);
  }
  return calls;
}

const SUPERSEDED = /event: failed\ndata: \{"status":"superseded"/;

/** Checks a stream's bytes (without `id:` lines) against the marker's frames. */
function judgeStream(text: string, marker: string): StreamEnd {
  const expected = expectedFrames(marker).join('');
  if (text === expected) return 'finished';
  const at = text.search(SUPERSEDED);
  // Frames of a discarded attempt are the same bytes (the provider answers a marker alike).
  if (at >= 0 && expected.startsWith(text.slice(0, at))) return 'superseded';
  return expected.startsWith(text) ? 'reset' : 'mismatch';
}

/** Where `actual` leaves `expected`, for a failure message. */
function difference(actual: string, expected: string): string {
  let i = 0;
  while (i < actual.length && actual[i] === expected[i]) i++;
  return `${actual.length} bytes where ${expected.length} were expected, differing at ${i}: got ${JSON.stringify(actual.slice(Math.max(0, i - 40), i + 160))}`;
}

export type MixedLoad = {
  /** Calls answered so far. */
  count(): number;
  /** The calls answered so far (the load goes on adding to it). */
  ops(): readonly Op[];
  stop(): Promise<LoadSummary>;
};

/**
 * Runs `concurrency` callers over `apis` (base URLs of processes with the API role) until
 * stopped. Answers that should carry a marker's bytes are compared byte for byte.
 */
export function startMixedLoad(
  apis: readonly string[],
  tenant: LoadTenant,
  opts: { concurrency: number; mix?: readonly [OpKind, number][]; /** A caller gives up after this long (status 0, detail `no answer`). */ giveUpAfterMs?: number },
): MixedLoad {
  const ops: Op[] = [];
  const accepted: Accepted[] = [];
  const mismatches: string[] = [];
  const errors: string[] = [];
  const mix = opts.mix ?? MIX;
  const weight = mix.reduce((n, [, w]) => n + w, 0);
  let running = true;
  const pick = (): OpKind => {
    let r = Math.random() * weight;
    for (const [kind, w] of mix) if ((r -= w) < 0) return kind;
    return mix[0]![0];
  };
  const anyApi = () => Math.floor(Math.random() * apis.length);
  const otherApi = (than: number) => (apis.length === 1 ? 0 : (than + 1 + Math.floor(Math.random() * (apis.length - 1))) % apis.length);
  const base = (api: number) => `${apis[api]}/${tenant.tenancy}/${tenant.namespace}/v1`;
  const headers = { 'content-type': 'application/json', 'x-sarsen-key': tenant.key };
  const body = (marker: string, stream: boolean) => JSON.stringify({ model: 'gpt-load', stream, messages: [{ content: marker, role: 'user' }] });

  type Answer = { status: number; text: string; reset: boolean; retryAfter?: string };
  const call = async (api: number, path: string, init: RequestInit): Promise<Answer> => {
    const signal = opts.giveUpAfterMs ? AbortSignal.timeout(opts.giveUpAfterMs) : undefined;
    let res: Response;
    try {
      res = await fetch(`${base(api)}${path}`, { ...init, ...(signal ? { signal } : {}) });
    } catch (err) {
      if (signal?.aborted) throw new Error(`no answer within ${opts.giveUpAfterMs} ms`);
      throw err;
    }
    const retryAfter = res.headers.get('retry-after') ?? undefined;
    try {
      return { status: res.status, text: Buffer.from(await res.arrayBuffer()).toString('utf8'), reset: false, ...(retryAfter ? { retryAfter } : {}) };
    } catch {
      if (signal?.aborted) throw new Error(`no answer within ${opts.giveUpAfterMs} ms (the body stalled)`);
      return { status: res.status, text: '', reset: true }; // the body was cut: a bare reset
    }
  };
  /** What an answer that is not the marker's says: its status, the start of its body, its Retry-After. */
  const refusal = (r: Answer) => ({ detail: r.text.slice(0, 200), ...(r.retryAfter ? { retryAfter: r.retryAfter } : {}) });

  /** A synchronous call (streaming or not) for `marker` to `api`; compares its answer. */
  const sync = async (kind: OpKind, api: number, marker: string, stream: boolean): Promise<Omit<Op, 'startedAt' | 'endedAt'>> => {
    const r = await call(api, '/chat/completions', { method: 'POST', headers, body: body(marker, stream) });
    if (r.status !== 200) return { kind, api, status: r.status, ...refusal(r) };
    if (!stream) {
      if (r.text !== expectedJson(marker)) mismatches.push(`${kind} ${marker}: answer differs`);
      return { kind, api, status: r.status };
    }
    const end = r.reset ? 'reset' : judgeStream(r.text, marker);
    if (end === 'mismatch') mismatches.push(`${kind} ${marker}: stream differs: ${difference(r.text, expectedFrames(marker).join(''))}`);
    return { kind, api, status: r.status, stream: end };
  };

  const replay = async (api: number): Promise<Omit<Op, 'startedAt' | 'endedAt'> | null> => {
    const a = accepted[Math.floor(Math.random() * accepted.length)];
    if (!a) return null;
    const from = otherApi(a.api);
    if (!a.streaming) {
      const r = await call(from, `/requests/${a.id}`, { headers });
      if (r.status === 200 && r.text.includes('"status":"succeeded"') && !r.text.includes(`"response":${expectedJson(a.marker)}`)) {
        mismatches.push(`replay ${a.id}: stored response differs`);
      }
      return { kind: 'replay', api: from, status: r.status, ...(r.status === 200 ? {} : refusal(r)) };
    }
    const r = await call(from, `/requests/${a.id}`, { headers: { ...headers, accept: 'text/event-stream' } });
    if (r.status !== 200) return { kind: 'replay', api: from, status: r.status, ...refusal(r) };
    const end = r.reset ? 'reset' : judgeStream(r.text.replace(/^id: \d+\n/gm, ''), a.marker);
    if (end === 'mismatch') mismatches.push(`replay ${a.id}: stream differs: ${difference(r.text, expectedFrames(a.marker).join(''))}`);
    return { kind: 'replay', api: from, status: r.status, stream: end };
  };

  const one = async (): Promise<void> => {
    const kind = pick();
    const api = anyApi();
    const marker = `m-${crypto.randomBytes(8).toString('hex')}`;
    const startedAt = Date.now();
    const record = (op: Omit<Op, 'startedAt' | 'endedAt'>): void => void ops.push({ ...op, startedAt, endedAt: Date.now() });
    try {
      if (kind === 'sync' || kind === 'stream') return record(await sync(kind, api, marker, kind === 'stream'));
      if (kind === 'duplicate') {
        const stream = Math.random() < 0.5;
        const both = await Promise.all([sync(kind, api, marker, stream), sync(kind, otherApi(api), marker, stream)]);
        return both.forEach(record);
      }
      if (kind === 'replay') {
        const op = await replay(api);
        if (op) record(op);
        return;
      }
      const streaming = kind === 'submit-stream';
      const r = await call(api, '/requests', { method: 'POST', headers, body: body(marker, streaming) });
      if (r.status === 202) accepted.push({ id: (JSON.parse(r.text) as { request_id: string }).request_id, marker, streaming, api, at: Date.now() });
      record({ kind, api, status: r.status, ...(r.status === 202 ? {} : refusal(r)) });
    } catch (err) {
      errors.push(`${kind} to api ${api}: ${(err as Error).message}`);
      record({ kind, api, status: 0, detail: (err as Error).message });
    }
  };

  const callers = Array.from({ length: opts.concurrency }, async () => {
    while (running) {
      await one();
      // A refusal (503 while no primary is writable) is answered at once: pace the retries.
      const last = ops.at(-1);
      if (last && last.status >= 500) await new Promise((r) => setTimeout(r, 50));
    }
  });
  return {
    count: () => ops.length,
    ops: () => ops,
    async stop() {
      running = false;
      await Promise.all(callers);
      return { ops, accepted, mismatches, errors };
    },
  };
}

export type StoredCheck = { requests: number; unfinished: string[]; doubleCalls: string[]; lostAccepted: string[] };

/**
 * After the load: every request row of the load's markers ended `succeeded`; each marker is one
 * request (duplicates attached); the provider was called at most once per attempt, and every
 * attempt after the first followed a recovery; every accepted id is among them.
 */
export async function verifyStored(pool: pg.Pool, provider: FakeProvider, accepted: readonly Accepted[]): Promise<StoredCheck> {
  const { rows } = await pool.query<{ id: string; status: string; attempts: number; recoveries: number; marker: string }>(
    `SELECT r.id, r.status, r.attempts, r.recoveries, substring(b.body from '"content":"(m-[0-9a-f]+)"') AS marker
       FROM sarsen.requests r JOIN sarsen.request_bodies b ON b.request_id = r.id
      WHERE b.body LIKE '%"m-%'`,
  );
  const calls = callsByMarker(provider);
  const byMarker = new Map<string, number>();
  const unfinished: string[] = [];
  const doubleCalls: string[] = [];
  for (const r of rows) {
    byMarker.set(r.marker, (byMarker.get(r.marker) ?? 0) + 1);
    if (r.status !== 'succeeded') unfinished.push(`${r.id} ${r.status}`);
    // Every call belongs to an attempt, and every attempt after the first to a recovery (an
    // executor that died before calling leaves an attempt without a call).
    const n = calls.get(r.marker) ?? 0;
    if (n < 1 || n > r.attempts || r.attempts !== r.recoveries + 1) doubleCalls.push(`${r.id}: ${n} provider calls, ${r.attempts} attempts, ${r.recoveries} recoveries`);
  }
  for (const [marker, n] of byMarker) if (n > 1) doubleCalls.push(`${marker}: ${n} requests for one body`);
  const ids = new Set(rows.map((r) => r.id));
  return { requests: rows.length, unfinished, doubleCalls, lostAccepted: accepted.filter((a) => !ids.has(a.id)).map((a) => a.id) };
}

/** Ops by kind and status, for a line of output. */
export function tally(ops: readonly Op[]): string {
  const counts = new Map<string, number>();
  for (const op of ops) counts.set(`${op.kind}:${op.status}`, (counts.get(`${op.kind}:${op.status}`) ?? 0) + 1);
  return [...counts].sort().map(([k, n]) => `${k}=${n}`).join(' ');
}
