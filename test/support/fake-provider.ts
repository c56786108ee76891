// A scriptable stand-in for the provider dialects Sarsen proxies (docs/api.md "Dialects"):
// chat, messages and responses, served over real sockets so tests exercise real transport faults.
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';

export type Behavior =
  | { kind: 'json'; status?: number; headers?: Record<string, string>; body: string | Buffer | object; delayMs?: number; after?: Promise<unknown> }
  | {
      kind: 'sse';
      frames: (string | Buffer)[];
      frameDelayMs?: number;
      firstDelayMs?: number;
      status?: number;
      headers?: Record<string, string>;
      dropAfter?: number;
      /** Frame index -> a promise that frame waits for (a test's gate: order, not time). */
      waitBefore?: Record<number, Promise<unknown>>;
    }
  | { kind: 'refuse'; status: number; body?: string | object; retryAfter?: string; headers?: Record<string, string> }
  | { kind: 'drop' }
  | { kind: 'hang' }
  | { kind: 'default'; delayMs?: number; frameDelayMs?: number; frameCount?: number };

export interface JournalEntry {
  seq: number;
  method: string;
  path: string;
  headers: Record<string, string | string[]>;
  rawHeaders: string[];
  body: Buffer;
  json: any;
  receivedAt: number;
  finishedAt?: number;
  clientAborted: boolean;
  behavior: Behavior['kind'];
}

export interface FakeProvider {
  url: string;
  journal: JournalEntry[];
  enqueue(...b: Behavior[]): void;
  rule(match: (e: JournalEntry) => Behavior | undefined): () => void;
  reset(): void;
  waitForRequests(n: number, timeoutMs?: number): Promise<JournalEntry[]>;
  /** Resolves once `pred()` holds; re-checked whenever a request arrives or finishes. */
  waitUntil(pred: () => boolean, timeoutMs?: number): Promise<void>;
  /** Bytes read off every connection since the last reset(): request lines, headers and bodies, as they arrived. */
  bytesReceived(): number;
  close(): Promise<void>;
}

export type Dialect = 'chat' | 'messages' | 'responses';
export type LineEnding = '\n' | '\r\n' | '\r';

export function dialectOf(path: string): Dialect | undefined {
  const p = path.split('?')[0];
  if (p === '/v1/chat/completions') return 'chat';
  if (p === '/v1/messages') return 'messages';
  if (p === '/v1/responses') return 'responses';
  return undefined;
}

// ---------- deterministic default answers ----------

function contentText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content
    .map((b) => (b && typeof b === 'object' && typeof b.text === 'string' ? b.text : ''))
    .join(' ');
}

function wordCount(s: string): number {
  const t = s.trim();
  return t === '' ? 0 : t.split(/\s+/).length;
}

export interface DefaultAnswer { text: string; promptTokens: number; completionTokens: number }

/**
 * The default answer is a pure function of the parsed body, so a test can compute it too:
 * text = `fake reply to N message(s) [marker]`, marker = first 40 code points of the last
 * message's text with whitespace collapsed; prompt tokens = per message 1 + its words, plus
 * the words of a string `system`; completion tokens = words of the text.
 */
export function defaultAnswer(json: any): DefaultAnswer {
  const messages: any[] = Array.isArray(json?.messages) ? json.messages : responsesInput(json?.input);
  const last = messages.length ? contentText(messages[messages.length - 1]?.content) : '';
  const marker = Array.from(last.replace(/\s+/g, ' ').trim()).slice(0, 40).join('');
  const text = `fake reply to ${messages.length} message(s) [${marker}]`;
  const system = json?.system ?? json?.instructions;
  let promptTokens = typeof system === 'string' ? wordCount(system) : 0;
  for (const m of messages) promptTokens += 1 + wordCount(contentText(m?.content));
  return { text, promptTokens, completionTokens: wordCount(text) };
}

/**
 * A Responses body's `input` read as messages: a string is one user message, an array's
 * items are messages (items of other types, such as function call outputs, count with no text).
 */
function responsesInput(input: unknown): any[] {
  if (typeof input === 'string') return [{ role: 'user', content: input }];
  return Array.isArray(input) ? input : [];
}

/** Splits by code points into exactly n pieces (some empty when the text is shorter than n). */
export function splitText(text: string, n: number): string[] {
  const cps = Array.from(text);
  const parts: string[] = [];
  for (let i = 0; i < n; i++) {
    parts.push(cps.slice(Math.floor((i * cps.length) / n), Math.floor(((i + 1) * cps.length) / n)).join(''));
  }
  return parts;
}

// ---------- realistic bodies and frames ----------

export interface ChatOptions {
  id?: string; model?: string; created?: number; finishReason?: string;
  promptTokens?: number; completionTokens?: number;
}

function chatUsage(texts: string[], o: ChatOptions) {
  const prompt = o.promptTokens ?? 10;
  const completion = o.completionTokens ?? wordCount(texts.join(''));
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
}

export function chatCompletionBody(text: string, o: ChatOptions = {}) {
  return {
    id: o.id ?? 'chatcmpl-fake', object: 'chat.completion', created: o.created ?? Math.floor(Date.now() / 1000),
    model: o.model ?? 'fake-model', system_fingerprint: 'fp_fake',
    choices: [{ index: 0, message: { role: 'assistant', content: text, refusal: null }, logprobs: null, finish_reason: o.finishReason ?? 'stop' }],
    usage: chatUsage([text], o),
  };
}

/** Raw chat SSE frames: role chunk, one chunk per text, finish chunk, optional usage chunk, [DONE]. */
export function chatFrames(texts: string[], o: ChatOptions & { usage?: boolean; lineEnding?: LineEnding } = {}): string[] {
  const le = o.lineEnding ?? '\n';
  const base = { id: o.id ?? 'chatcmpl-fake', object: 'chat.completion.chunk', created: o.created ?? Math.floor(Date.now() / 1000), model: o.model ?? 'fake-model', system_fingerprint: 'fp_fake' };
  const extra = o.usage ? { usage: null } : {};
  const chunk = (delta: object, finish: string | null) => ({ ...base, choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }], ...extra });
  const events: object[] = [chunk({ role: 'assistant', content: '', refusal: null }, null)];
  for (const t of texts) events.push(chunk({ content: t }, null));
  events.push(chunk({}, o.finishReason ?? 'stop'));
  if (o.usage) events.push({ ...base, choices: [], usage: chatUsage(texts, o) });
  const frame = (data: string) => `data: ${data}${le}${le}`;
  return [...events.map((e) => frame(JSON.stringify(e))), frame('[DONE]')];
}

export interface MessagesOptions {
  id?: string; model?: string; stopReason?: string;
  inputTokens?: number; outputTokens?: number; cacheCreationInputTokens?: number; cacheReadInputTokens?: number;
}

function messagesUsage(texts: string[], o: MessagesOptions) {
  return {
    input_tokens: o.inputTokens ?? 10,
    cache_creation_input_tokens: o.cacheCreationInputTokens ?? 0,
    cache_read_input_tokens: o.cacheReadInputTokens ?? 0,
    output_tokens: o.outputTokens ?? wordCount(texts.join('')),
  };
}

export function messagesBody(text: string, o: MessagesOptions = {}) {
  return {
    id: o.id ?? 'msg_fake', type: 'message', role: 'assistant', model: o.model ?? 'fake-model',
    content: [{ type: 'text', text }], stop_reason: o.stopReason ?? 'end_turn', stop_sequence: null,
    usage: messagesUsage([text], o),
  };
}

/** Raw messages SSE frames in the vendor's order, each with its `event:` line. */
export function messagesFrames(texts: string[], o: MessagesOptions & { lineEnding?: LineEnding; ping?: boolean } = {}): string[] {
  const le = o.lineEnding ?? '\n';
  const u = messagesUsage(texts, o);
  const frame = (event: string, data: object) => `event: ${event}${le}data: ${JSON.stringify(data)}${le}${le}`;
  const frames = [
    frame('message_start', {
      type: 'message_start',
      message: {
        id: o.id ?? 'msg_fake', type: 'message', role: 'assistant', model: o.model ?? 'fake-model', content: [],
        stop_reason: null, stop_sequence: null,
        usage: { input_tokens: u.input_tokens, cache_creation_input_tokens: u.cache_creation_input_tokens, cache_read_input_tokens: u.cache_read_input_tokens, output_tokens: 1 },
      },
    }),
    frame('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }),
  ];
  if (o.ping ?? true) frames.push(frame('ping', { type: 'ping' }));
  for (const t of texts) frames.push(frame('content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: t } }));
  frames.push(
    frame('content_block_stop', { type: 'content_block_stop', index: 0 }),
    frame('message_delta', { type: 'message_delta', delta: { stop_reason: o.stopReason ?? 'end_turn', stop_sequence: null }, usage: { output_tokens: u.output_tokens } }),
    frame('message_stop', { type: 'message_stop' }),
  );
  return frames;
}

export interface ResponsesOptions {
  id?: string; messageId?: string; model?: string; createdAt?: number;
  inputTokens?: number; outputTokens?: number;
  /** How the stream ends (the vendor's terminal events); `completed` by default. */
  end?: 'completed' | 'incomplete' | 'failed';
}

function responsesUsage(texts: string[], o: ResponsesOptions) {
  const input = o.inputTokens ?? 10;
  const output = o.outputTokens ?? wordCount(texts.join(''));
  return {
    input_tokens: input, input_tokens_details: { cached_tokens: 0 },
    output_tokens: output, output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: input + output,
  };
}

const outputText = (text: string) => ({ type: 'output_text', annotations: [], logprobs: [], text });

function responseObject(o: ResponsesOptions, status: string, output: object[], usage: object | null, extra: object = {}) {
  return {
    id: o.id ?? 'resp_fake', object: 'response', created_at: o.createdAt ?? Math.floor(Date.now() / 1000), status,
    background: false, error: null, incomplete_details: null, instructions: null, max_output_tokens: null,
    model: o.model ?? 'fake-model', output, parallel_tool_calls: true, previous_response_id: null,
    reasoning: { effort: null, summary: null }, service_tier: 'default', store: true, temperature: 1.0,
    text: { format: { type: 'text' } }, tool_choice: 'auto', tools: [], top_p: 1.0, truncation: 'disabled',
    usage, user: null, metadata: {}, ...extra,
  };
}

/** A Responses API answer (`object: "response"`), one assistant message holding `text`. */
export function responsesBody(text: string, o: ResponsesOptions = {}) {
  const message = { id: o.messageId ?? 'msg_fake', type: 'message', status: 'completed', role: 'assistant', content: [outputText(text)] };
  return responseObject(o, 'completed', [message], responsesUsage([text], o));
}

/**
 * Raw Responses SSE frames in the vendor's order, each with its `event:` line and a
 * `sequence_number` counting from 0: response.created, response.in_progress,
 * response.output_item.added, response.content_part.added, one response.output_text.delta per
 * text, response.output_text.done, response.content_part.done, response.output_item.done, and
 * the terminal event (response.completed, carrying the usage; or response.incomplete or
 * response.failed).
 */
export function responsesFrames(texts: string[], o: ResponsesOptions & { lineEnding?: LineEnding } = {}): string[] {
  const le = o.lineEnding ?? '\n';
  const itemId = o.messageId ?? 'msg_fake';
  const full = texts.join('');
  let seq = 0;
  const frame = (type: string, data: object) => `event: ${type}${le}data: ${JSON.stringify({ type, ...data, sequence_number: seq++ })}${le}${le}`;
  const item = (status: string, content: object[]) => ({ id: itemId, type: 'message', status, content, role: 'assistant' });
  const at = { item_id: itemId, output_index: 0, content_index: 0 };
  const frames = [
    frame('response.created', { response: responseObject(o, 'in_progress', [], null) }),
    frame('response.in_progress', { response: responseObject(o, 'in_progress', [], null) }),
    frame('response.output_item.added', { output_index: 0, item: item('in_progress', []) }),
    frame('response.content_part.added', { ...at, part: outputText('') }),
  ];
  for (const t of texts) frames.push(frame('response.output_text.delta', { ...at, delta: t, logprobs: [] }));
  const end = o.end ?? 'completed';
  const done = item(end === 'completed' ? 'completed' : 'incomplete', [outputText(full)]);
  frames.push(
    frame('response.output_text.done', { ...at, text: full, logprobs: [] }),
    frame('response.content_part.done', { ...at, part: outputText(full) }),
    frame('response.output_item.done', { output_index: 0, item: done }),
  );
  const usage = responsesUsage(texts, o);
  if (end === 'completed') frames.push(frame('response.completed', { response: responseObject(o, 'completed', [done], usage) }));
  else if (end === 'incomplete') {
    frames.push(frame('response.incomplete', { response: responseObject(o, 'incomplete', [done], usage, { incomplete_details: { reason: 'max_output_tokens' } }) }));
  } else {
    frames.push(frame('response.failed', { response: responseObject(o, 'failed', [done], usage, { error: { code: 'server_error', message: 'fake provider: the response failed' } }) }));
  }
  return frames;
}

const ERROR_TYPES: Record<number, string> = {
  400: 'invalid_request_error', 401: 'authentication_error', 403: 'permission_error', 404: 'not_found_error',
  408: 'timeout_error', 413: 'request_too_large', 429: 'rate_limit_error', 529: 'overloaded_error',
};

/** A vendor-shaped error body for a refusal (messages shape on /v1/messages, the chat vendor's elsewhere, /v1/responses included). */
export function errorBody(dialect: Dialect | undefined, status: number, message: string): object {
  const type = ERROR_TYPES[status] ?? (status >= 500 ? 'api_error' : 'invalid_request_error');
  return dialect === 'messages'
    ? { type: 'error', error: { type, message } }
    : { error: { message, type, param: null, code: null } };
}

// ---------- behavior execution ----------

interface Ctx { req: http.IncomingMessage; res: http.ServerResponse; entry: JournalEntry; signal: AbortSignal; markSelfClosed(): void }

function sendJson(res: http.ServerResponse, status: number, body: string | Buffer | object, headers: Record<string, string> = {}): void {
  const buf = Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': String(buf.length), ...headers });
  res.end(buf);
}

/** Resolves false when the request went away during the wait (timer cancelled). */
async function wait(ms: number | undefined, signal: AbortSignal): Promise<boolean> {
  if (!ms) return !signal.aborted;
  try { await sleep(ms, undefined, { signal }); return true; } catch { return false; }
}

/** Resolves false when the request went away before `event` settled. */
function awaitUnlessGone(event: Promise<unknown>, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    signal.addEventListener('abort', () => resolve(false), { once: true });
    event.then(() => resolve(!signal.aborted), () => resolve(!signal.aborted));
  });
}

function writeAndFlush(res: http.ServerResponse, chunk: string | Buffer): Promise<void> {
  return new Promise((resolve) => { res.write(chunk, () => resolve()); });
}

async function streamFrames(ctx: Ctx, b: Extract<Behavior, { kind: 'sse' }>): Promise<void> {
  const { res, signal } = ctx;
  res.writeHead(b.status ?? 200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', ...b.headers });
  res.flushHeaders();
  const limit = b.dropAfter === undefined ? b.frames.length : Math.min(b.dropAfter, b.frames.length);
  for (let i = 0; i < limit; i++) {
    const gate = b.waitBefore?.[i];
    if (gate && !(await awaitUnlessGone(gate, signal))) return;
    if (!(await wait(i === 0 ? b.firstDelayMs : b.frameDelayMs, signal))) return;
    // Only wait for the kernel hand-off when a drop follows, so plain streams stay fast.
    if (i === limit - 1 && b.dropAfter !== undefined) await writeAndFlush(res, b.frames[i]);
    else res.write(b.frames[i]);
  }
  if (b.dropAfter === undefined) { res.end(); return; }
  const sock = res.socket;
  if (limit === 0 && sock) await new Promise<void>((r) => { sock.write('', () => r()); });
  ctx.markSelfClosed();
  sock?.destroy();
}

function defaultBehavior(ctx: Ctx, b: Extract<Behavior, { kind: 'default' }>): Promise<void> | void {
  const { res, entry } = ctx;
  const dialect = dialectOf(entry.path);
  if (!dialect || entry.method !== 'POST') {
    return sendJson(res, 404, errorBody(dialect, 404, `fake provider: no route for ${entry.method} ${entry.path}`));
  }
  const json = entry.json;
  if (!json || typeof json !== 'object' || Array.isArray(json)) {
    return sendJson(res, 400, errorBody(dialect, 400, 'fake provider: body is not a JSON object'));
  }
  const ans = defaultAnswer(json);
  const model = typeof json.model === 'string' ? json.model : 'fake-model';
  const headers: Record<string, string> = { [dialect === 'messages' ? 'request-id' : 'x-request-id']: `req_fake_${entry.seq}` };
  const responses: ResponsesOptions = { id: `resp_fake_${entry.seq}`, messageId: `msg_fake_${entry.seq}`, model, inputTokens: ans.promptTokens, outputTokens: ans.completionTokens };
  const respond = (): Promise<void> | void => {
    // The vendor's own background mode: a queued placeholder at once (the answer stays at the
    // vendor). Sarsen never sends `background` (docs/api.md "Background responses").
    if (dialect === 'responses' && json.background === true && json.stream !== true) {
      return sendJson(res, 200, { ...responseObject(responses, 'queued', [], null), background: true }, headers);
    }
    if (json.stream !== true) {
      const body = dialect === 'chat'
        ? chatCompletionBody(ans.text, { id: `chatcmpl-fake-${entry.seq}`, model, promptTokens: ans.promptTokens, completionTokens: ans.completionTokens })
        : dialect === 'responses'
          ? responsesBody(ans.text, responses)
          : messagesBody(ans.text, { id: `msg_fake_${entry.seq}`, model, inputTokens: ans.promptTokens, outputTokens: ans.completionTokens });
      return sendJson(res, 200, body, headers);
    }
    const pieces = splitText(ans.text, b.frameCount ?? 4);
    const frames = dialect === 'chat'
      ? chatFrames(pieces, { id: `chatcmpl-fake-${entry.seq}`, model, usage: json.stream_options?.include_usage === true, promptTokens: ans.promptTokens, completionTokens: ans.completionTokens })
      : dialect === 'responses'
        ? responsesFrames(pieces, responses)
        : messagesFrames(pieces, { id: `msg_fake_${entry.seq}`, model, inputTokens: ans.promptTokens, outputTokens: ans.completionTokens });
    return streamFrames(ctx, { kind: 'sse', frames, frameDelayMs: b.frameDelayMs, headers });
  };
  if (!b.delayMs) return respond();
  return wait(b.delayMs, ctx.signal).then((ok) => (ok ? respond() : undefined));
}

async function run(ctx: Ctx, b: Behavior): Promise<void> {
  const { res, entry, signal } = ctx;
  switch (b.kind) {
    case 'default': return defaultBehavior(ctx, b);
    case 'json':
      if (b.after && !(await awaitUnlessGone(b.after, signal))) return;
      if (await wait(b.delayMs, signal)) sendJson(res, b.status ?? 200, b.body, b.headers);
      return;
    case 'sse': return streamFrames(ctx, b);
    case 'refuse': {
      const headers: Record<string, string> = { ...(b.retryAfter !== undefined ? { 'retry-after': b.retryAfter } : {}), ...b.headers };
      const body = b.body ?? errorBody(dialectOf(entry.path), b.status, `fake provider refused with ${b.status}`);
      return sendJson(res, b.status, body, headers);
    }
    case 'drop':
      ctx.markSelfClosed();
      ctx.req.socket.destroy();
      return;
    case 'hang': return;
  }
}

// ---------- the server ----------

export async function startFakeProvider(opts: { host?: string } = {}): Promise<FakeProvider> {
  const host = opts.host ?? '127.0.0.1';
  const journal: JournalEntry[] = [];
  let queue: Behavior[] = [];
  let rules: ((e: JournalEntry) => Behavior | undefined)[] = [];
  const listeners = new Set<() => void>();
  const sockets = new Set<Socket>();
  let seq = 0;
  let closing = false;

  const notify = () => { for (const l of [...listeners]) l(); };

  const choose = (entry: JournalEntry): Behavior => {
    const queued = queue.shift();
    if (queued) return queued;
    for (const r of rules) {
      const b = r(entry);
      if (b) return b;
    }
    return { kind: 'default' };
  };

  const onRequest = (req: http.IncomingMessage, res: http.ServerResponse, body: Buffer, receivedAt: number) => {
    const headers: Record<string, string | string[]> = {};
    for (const [k, v] of Object.entries(req.headers)) if (v !== undefined) headers[k] = v;
    let json: any;
    if (body.length) { try { json = JSON.parse(body.toString('utf8')); } catch { json = undefined; } }
    const entry: JournalEntry = {
      seq: ++seq, method: req.method ?? 'GET', path: req.url ?? '/', headers, rawHeaders: req.rawHeaders,
      body, json, receivedAt, clientAborted: false, behavior: 'default',
    };
    const ac = new AbortController();
    let selfClosed = false;
    res.on('close', () => {
      if (!res.writableFinished && !selfClosed && !closing) entry.clientAborted = true;
      entry.finishedAt ??= Date.now();
      ac.abort();
      notify();
    });
    let behavior: Behavior;
    try { behavior = choose(entry); } catch (err) {
      behavior = { kind: 'refuse', status: 500, body: { error: { message: `fake provider rule threw: ${String(err)}` } } };
    }
    entry.behavior = behavior.kind;
    journal.push(entry);
    notify();
    const ctx: Ctx = { req, res, entry, signal: ac.signal, markSelfClosed: () => { selfClosed = true; } };
    const done = run(ctx, behavior);
    if (done) done.catch(() => { if (!res.destroyed) res.destroy(); });
  };

  const server = http.createServer({ keepAlive: true }, (req, res) => {
    const receivedAt = Date.now();
    const chunks: Buffer[] = [];
    req.on('error', () => {});
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => onRequest(req, res, chunks.length === 1 ? chunks[0] : Buffer.concat(chunks), receivedAt));
  });
  // Bytes read per connection: counted at its close, or read live while it is open.
  let closedBytes = 0;
  const readBefore = new Map<Socket, number>(); // what an open connection had read at the last reset
  server.on('connection', (s: Socket) => {
    s.setNoDelay(true);
    sockets.add(s);
    readBefore.set(s, 0);
    s.on('close', () => {
      closedBytes += s.bytesRead - (readBefore.get(s) ?? 0);
      readBefore.delete(s);
      sockets.delete(s);
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => { server.off('error', reject); resolve(); });
  });
  const port = (server.address() as AddressInfo).port;

  const waitUntil = (pred: () => boolean, timeoutMs = 5000) => new Promise<void>((resolve, reject) => {
    if (pred()) { resolve(); return; }
    const timer = setTimeout(() => {
      listeners.delete(check);
      reject(new Error(`fake provider: condition not met within ${timeoutMs} ms (journal has ${journal.length} entries)`));
    }, timeoutMs);
    function check() {
      if (closing) { listeners.delete(check); clearTimeout(timer); reject(new Error('fake provider closed while waiting')); return; }
      if (!pred()) return;
      listeners.delete(check);
      clearTimeout(timer);
      resolve();
    }
    listeners.add(check);
  });

  return {
    url: `http://${host.includes(':') ? `[${host}]` : host}:${port}`,
    journal,
    enqueue: (...b) => { queue.push(...b); },
    rule: (match) => {
      rules.push(match);
      return () => { rules = rules.filter((r) => r !== match); };
    },
    reset: () => {
      journal.length = 0; queue = []; rules = [];
      closedBytes = 0;
      for (const s of readBefore.keys()) readBefore.set(s, s.bytesRead);
    },
    bytesReceived: () => closedBytes + [...readBefore].reduce((n, [s, before]) => n + s.bytesRead - before, 0),
    waitUntil,
    waitForRequests: (n, timeoutMs) => waitUntil(() => journal.length >= n, timeoutMs).then(() => journal.slice()),
    close: async () => {
      closing = true;
      notify();
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const s of sockets) s.destroy();
      await closed;
    },
  };
}
