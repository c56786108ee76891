// Token normalisation (docs/accounting.md "Token counts", "Usage").
//
// Every dialect is reduced to prompt / completion / total. `null` means the
// provider did not say; a reported 0 stays 0. Nothing here throws on a provider's
// bytes: a malformed answer or frame simply reports nothing.
//
// chat:     usage.prompt_tokens, usage.completion_tokens, usage.total_tokens
//           (total falls back to prompt + completion when the provider omits it).
// messages: prompt = input_tokens + cache_creation_input_tokens + cache_read_input_tokens
//           (absent cache fields count 0; absent input_tokens makes prompt unknown),
//           completion = output_tokens, total = prompt + completion when both known.
// responses: usage.input_tokens, usage.output_tokens, usage.total_tokens (input_tokens already
//           counts cached tokens; total falls back to input + output when omitted).
import { frameEvent } from './sse-framer.ts';
import type { Dialect } from './dialects.ts';

export type { Dialect } from './dialects.ts';
export type Tokens = { prompt: number | null; completion: number | null; total: number | null };

export type StreamTokenReader = {
  /** Feeds one frame as produced by the framer; frames that carry no usage are ignored. */
  push(frame: Buffer): void;
  /** Tokens seen so far. */
  result(): Tokens;
};

// The provider's raw usage fields, each a count or unknown.
type ChatUsage = { prompt_tokens: number | null; completion_tokens: number | null; total_tokens: number | null };
type MessagesUsage = {
  input_tokens: number | null;
  cache_creation_input_tokens: number | null;
  cache_read_input_tokens: number | null;
  output_tokens: number | null;
};

type ResponsesUsage = { input_tokens: number | null; output_tokens: number | null; total_tokens: number | null };

const CHAT_FIELDS = ['prompt_tokens', 'completion_tokens', 'total_tokens'] as const;
const RESPONSES_FIELDS = ['input_tokens', 'output_tokens', 'total_tokens'] as const;
// A streamed response's usage arrives on its terminal event, whichever way it ended.
const RESPONSES_TERMINAL = new Set(['response.completed', 'response.incomplete', 'response.failed']);
const MESSAGES_FIELDS = ['input_tokens', 'cache_creation_input_tokens', 'cache_read_input_tokens', 'output_tokens'] as const;

export function tokensFromAnswer(dialect: Dialect, body: Buffer | string): Tokens {
  const answer = parseObject(typeof body === 'string' ? body : body.toString('utf8'));
  const usage = answer === null ? null : asObject(answer.usage);
  if (dialect === 'chat') {
    const raw = emptyChat();
    if (usage !== null) mergeCounts(raw, usage, CHAT_FIELDS);
    return fromChat(raw);
  }
  if (dialect === 'responses') {
    const raw = emptyResponses();
    if (usage !== null) mergeCounts(raw, usage, RESPONSES_FIELDS);
    return fromResponses(raw);
  }
  const raw = emptyMessages();
  if (usage !== null) mergeCounts(raw, usage, MESSAGES_FIELDS);
  return fromMessages(raw);
}

/**
 * Reads usage from a stream's frames. chat: any chunk's `usage` object (normally
 * only the final one, when `stream_options.include_usage` was set). messages:
 * `message_start`'s `message.usage` and `message_delta`'s `usage`. responses: the
 * `response` of `response.completed` (or `response.incomplete`, `response.failed`). Later counts
 * override earlier ones field by field; a field sent as null or left out keeps
 * what was known.
 */
export function createStreamTokenReader(dialect: Dialect): StreamTokenReader {
  if (dialect === 'chat') {
    const raw = emptyChat();
    return {
      push(frame) {
        const chunk = frameObject(frame);
        const usage = chunk === null ? null : asObject(chunk.usage);
        if (usage !== null) mergeCounts(raw, usage, CHAT_FIELDS);
      },
      result: () => fromChat(raw),
    };
  }
  if (dialect === 'responses') {
    const raw = emptyResponses();
    return {
      push(frame) {
        const event = frameObject(frame);
        if (event === null || !RESPONSES_TERMINAL.has(event.type as string)) return;
        const usage = asObject(asObject(event.response)?.usage);
        if (usage !== null) mergeCounts(raw, usage, RESPONSES_FIELDS);
      },
      result: () => fromResponses(raw),
    };
  }
  const raw = emptyMessages();
  return {
    push(frame) {
      const event = frameObject(frame);
      if (event === null) return;
      let usage: Record<string, unknown> | null = null;
      if (event.type === 'message_start') usage = asObject(asObject(event.message)?.usage);
      else if (event.type === 'message_delta') usage = asObject(event.usage);
      if (usage !== null) mergeCounts(raw, usage, MESSAGES_FIELDS);
    },
    result: () => fromMessages(raw),
  };
}

function fromChat(u: ChatUsage): Tokens {
  const { prompt_tokens: prompt, completion_tokens: completion } = u;
  const total = u.total_tokens ?? (prompt !== null && completion !== null ? prompt + completion : null);
  return { prompt, completion, total };
}

function fromMessages(u: MessagesUsage): Tokens {
  const prompt =
    u.input_tokens === null ? null : u.input_tokens + (u.cache_creation_input_tokens ?? 0) + (u.cache_read_input_tokens ?? 0);
  const completion = u.output_tokens;
  const total = prompt !== null && completion !== null ? prompt + completion : null;
  return { prompt, completion, total };
}

function fromResponses(u: ResponsesUsage): Tokens {
  const { input_tokens: prompt, output_tokens: completion } = u;
  const total = u.total_tokens ?? (prompt !== null && completion !== null ? prompt + completion : null);
  return { prompt, completion, total };
}

const emptyResponses = (): ResponsesUsage => ({ input_tokens: null, output_tokens: null, total_tokens: null });
const emptyChat = (): ChatUsage => ({ prompt_tokens: null, completion_tokens: null, total_tokens: null });
const emptyMessages = (): MessagesUsage => ({
  input_tokens: null,
  cache_creation_input_tokens: null,
  cache_read_input_tokens: null,
  output_tokens: null,
});

function mergeCounts<K extends string>(into: Record<K, number | null>, from: Record<string, unknown>, fields: readonly K[]): void {
  for (const f of fields) {
    const v = from[f];
    // Only a plausible count is believed; anything else leaves the field as it was.
    if (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0) into[f] = v;
  }
}

// The frame's data as a JSON object, or null ([DONE], pings, comments, garbage).
function frameObject(frame: Buffer): Record<string, unknown> | null {
  // Cheap pre-check on the bytes: most frames are content deltas with no usage in them, and
  // need not be decoded at all.
  if (!frame.includes(USAGE)) return null;
  return parseObject(frameEvent(frame).data);
}

const USAGE = Buffer.from('usage');

function parseObject(text: string): Record<string, unknown> | null {
  try {
    return asObject(JSON.parse(text));
  } catch {
    return null;
  }
}

function asObject(v: unknown): Record<string, unknown> | null {
  return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
}
