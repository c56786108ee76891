// Background responses (docs/api.md "Background responses"): the pure parts. Sarsen performs
// the reference vendor's background mode itself, so the shapes here are the vendor's (its SDK's
// Response, ResponseErrorEvent and ResponseItemList), filled from what Sarsen stored.
import { parseCanonical, isJsonObject, stringifyCanonical, type JsonObject, type JsonValue } from './canonical-json.ts';
import { topLevelValueSpan } from './json-span.ts';

/**
 * The body sent upstream for a stored Responses body: `background` removed (docs/api.md
 * "Background responses": Sarsen keeps the call running itself, for every provider). The body is
 * canonical, so a body without the field is passed on as it is, and with it re-serialised
 * canonically without it.
 */
export function upstreamBody(body: string): string {
  if (!body.includes('"background":')) return body;
  const { value } = parseCanonical(body);
  if (!isJsonObject(value) || !Object.hasOwn(value, 'background')) return body;
  const rest: JsonObject = {};
  for (const k of Object.keys(value)) if (k !== 'background') rest[k] = value[k]!;
  return stringifyCanonical(rest);
}

// The vendor writes `id` first; the regexes are the quick path, the parse the sure one.
const LEADING_ID = /^\s*\{\s*"id"\s*:\s*"([^"\\]{1,256})"/;
const CREATED_ID = /"response"\s*:\s*\{\s*"id"\s*:\s*"([^"\\]{1,256})"/;

const stringId = (v: unknown): string | null => (typeof v === 'string' && v.length > 0 && v.length <= 256 ? v : null);

/** The provider's response id of a whole Responses answer (its top-level `id`), or null. */
export function answerResponseId(body: Buffer): string | null {
  const head = LEADING_ID.exec(body.subarray(0, 512).toString('utf8'));
  if (head) return head[1]!;
  try {
    return stringId((JSON.parse(body.toString('utf8')) as { id?: unknown })?.id);
  } catch {
    return null;
  }
}

/** The `data:` payload of one SSE frame (its data lines joined), or null. */
export function frameData(frame: string): string | null {
  const lines = frame.split(/\r\n|\r|\n/).filter((l) => l.startsWith('data:'));
  if (lines.length === 0) return null;
  return lines.map((l) => l.slice(l.startsWith('data: ') ? 6 : 5)).join('\n');
}

/** The provider's response id of a stream's frame that carries a `response` (response.created first), or null. */
export function frameResponseId(frame: Buffer): string | null {
  const text = frame.toString('utf8');
  const quick = CREATED_ID.exec(text);
  if (quick) return quick[1]!;
  const data = frameData(text);
  if (data === null) return null;
  try {
    return stringId((JSON.parse(data) as { response?: { id?: unknown } })?.response?.id);
  } catch {
    return null;
  }
}

// A top-level `sequence_number` of an event's data. Inside a JSON string a quote is escaped, so
// this cannot match text the model wrote; the vendor puts the member on the event, not deeper.
const SEQUENCE = /"sequence_number"\s*:\s*(\d{1,15})\b/;

/** The provider's `sequence_number` of a frame, or null when it numbers none. */
export function frameSequence(frame: string): number | null {
  const m = SEQUENCE.exec(frame);
  return m ? Number(m[1]) : null;
}

/** The terminal events of a Responses stream, whose `response` is the final Response. */
const TERMINAL_EVENT = /^event:\s*response\.(completed|failed|incomplete)\s*$/m;

/**
 * The final Response of a stream, as the text of its terminal event's `response` member
 * byte for byte (docs/api.md "Background responses"), or null when the frame is not one.
 */
export function terminalResponse(frame: string): string | null {
  const data = frameData(frame);
  if (data === null) return null;
  if (!TERMINAL_EVENT.test(frame) && !/"type"\s*:\s*"response\.(completed|failed|incomplete)"/.test(data)) return null;
  try {
    JSON.parse(data);
    const span = topLevelValueSpan(data, 'response');
    return span === null ? null : data.slice(span[0], span[1]);
  } catch {
    return null;
  }
}

/** Sarsen's response id for a request: its id spelled the vendor's way (`resp_` for `req_`). */
export const ownResponseId = (requestId: string): string => `resp_${requestId.slice('req_'.length)}`;

export type ResponseStatus = 'queued' | 'in_progress' | 'completed' | 'failed' | 'cancelled' | 'incomplete';

/**
 * A Response object Sarsen writes itself (one still running, or one that ended without a
 * provider Response: refused, unreachable, cancelled), echoing the request's own settings.
 */
export function responseObject(o: {
  id: string;
  createdAtMs: number;
  status: ResponseStatus;
  model: string;
  body: JsonObject | null;
  background: boolean;
  error?: { code: string; message: string } | null;
}): string {
  const b = o.body ?? {};
  const echo = (k: string, fallback: JsonValue): JsonValue => (Object.hasOwn(b, k) ? b[k]! : fallback);
  const head = {
    id: o.id,
    object: 'response',
    created_at: Math.floor(o.createdAtMs / 1000),
    status: o.status,
    background: o.background,
    error: o.error ?? null,
    incomplete_details: null,
    model: o.model,
    output: [],
    usage: null,
  };
  // Echoed fields keep their stored text (number spellings included).
  const echoed: Record<string, JsonValue> = {
    instructions: echo('instructions', null),
    max_output_tokens: echo('max_output_tokens', null),
    metadata: echo('metadata', {}),
    parallel_tool_calls: echo('parallel_tool_calls', true),
    previous_response_id: echo('previous_response_id', null),
    store: echo('store', true),
    temperature: echo('temperature', null),
    tool_choice: echo('tool_choice', 'auto'),
    tools: echo('tools', []),
    top_p: echo('top_p', null),
  };
  const tail = Object.entries(echoed).map(([k, v]) => `${JSON.stringify(k)}:${stringifyCanonical(v)}`);
  return `${JSON.stringify(head).slice(0, -1)},${tail.join(',')}}`;
}

/**
 * The `error` of a failed Response from Sarsen's stored failure: the provider's refusal
 * (`{"error": {"code", "message", ...}}`) or Sarsen's own envelope, as `{code, message}`.
 */
export function responseError(stored: Buffer, errorStatus: number | null): { code: string; message: string } {
  try {
    const e = (JSON.parse(stored.toString('utf8')) as { error?: { code?: unknown; type?: unknown; message?: unknown } })?.error;
    const code = typeof e?.code === 'string' ? e.code : typeof e?.type === 'string' ? e.type : errorStatus !== null && errorStatus >= 500 ? 'server_error' : 'invalid_request';
    return { code, message: typeof e?.message === 'string' ? e.message : 'The provider refused the request.' };
  } catch {
    return { code: 'server_error', message: `The provider answered ${errorStatus ?? 'with a failure'} that was not JSON.` };
  }
}

/** The dialect's own `error` event (the SDK's ResponseErrorEvent), which the official SDK raises. */
export function errorEvent(code: string, message: string, sequenceNumber: number): string {
  return `event: error\ndata: ${JSON.stringify({ type: 'error', code, message, param: null, sequence_number: sequenceNumber })}\n\n`;
}

/** An input item as the vendor lists it: the stored item, a string input as one user message; each with an id. */
export function inputItems(body: JsonObject, requestId: string): (JsonObject & { id: string })[] {
  const input = body.input;
  const items: JsonValue[] = typeof input === 'string'
    ? [{ type: 'message', role: 'user', content: [{ type: 'input_text', text: input }] }]
    : Array.isArray(input) ? input : [];
  return items.filter(isJsonObject).map((item, i) => {
    // A bare {role, content} is an EasyInputMessage: listed as the message it is.
    const typed: JsonObject = Object.hasOwn(item, 'type') ? { ...item } : { type: 'message', ...item };
    if (typeof typed.content === 'string' && typed.type === 'message') typed.content = [{ type: typed.role === 'assistant' ? 'output_text' : 'input_text', text: typed.content }];
    if (typeof typed.id !== 'string') typed.id = `${requestId.replace(/^req_/, 'msg_')}_${i}`;
    if (typed.type === 'message' && !Object.hasOwn(typed, 'status')) typed.status = 'completed';
    return typed as JsonObject & { id: string };
  });
}
