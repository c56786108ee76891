// What the OpenTelemetry GenAI semantic conventions (v1.37 and later: `gen_ai.provider.name`,
// which replaced `gen_ai.system`) ask of a client span, read from a provider's answer: the
// response id, the response model and the finish reasons (docs/operations.md "Tracing"). Only
// identifiers and enumerated values are read, never text of the prompt or the answer; nothing
// here throws on a provider's bytes.
import type { Dialect } from './dialects.ts';
import { frameData } from './background.ts';

/** The conventions' names, in one place. */
export const GENAI = {
  operation: 'gen_ai.operation.name',
  provider: 'gen_ai.provider.name',
  requestModel: 'gen_ai.request.model',
  responseModel: 'gen_ai.response.model',
  responseId: 'gen_ai.response.id',
  finishReasons: 'gen_ai.response.finish_reasons',
  inputTokens: 'gen_ai.usage.input_tokens',
  outputTokens: 'gen_ai.usage.output_tokens',
  tokenType: 'gen_ai.token.type',
} as const;

/** Every dialect Sarsen serves is a chat operation in the conventions' terms. */
export const OPERATION = 'chat';

/** The conventions' provider names: Sarsen knows a backend by the API it speaks. */
export const providerName = (backendDialect: 'chat' | 'messages'): string => (backendDialect === 'messages' ? 'anthropic' : 'openai');

export type ResponseFacts = { id: string | null; model: string | null; finishReasons: string[] };

// Identifiers and enumerated values only: anything longer is not one.
const short = (v: unknown): string | null => (typeof v === 'string' && v.length > 0 && v.length <= 128 ? v : null);
const asObject = (v: unknown): Record<string, unknown> | null => (typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : null);

function parse(text: string): Record<string, unknown> | null {
  try {
    return asObject(JSON.parse(text));
  } catch {
    return null;
  }
}

const empty = (): ResponseFacts => ({ id: null, model: null, finishReasons: [] });

function addReason(facts: ResponseFacts, v: unknown): void {
  const reason = short(v);
  if (reason !== null && !facts.finishReasons.includes(reason)) facts.finishReasons.push(reason);
}

/** Takes what one object of the dialect tells (a whole answer, or one event of a stream). */
function take(dialect: Dialect, facts: ResponseFacts, o: Record<string, unknown>): void {
  if (dialect === 'chat') {
    facts.id ??= short(o.id);
    facts.model ??= short(o.model);
    if (Array.isArray(o.choices)) for (const c of o.choices) addReason(facts, asObject(c)?.finish_reason);
    return;
  }
  if (dialect === 'messages') {
    const message = o.type === 'message_start' ? asObject(o.message) : o.type === 'message' ? o : null;
    if (message) {
      facts.id ??= short(message.id);
      facts.model ??= short(message.model);
      addReason(facts, message.stop_reason);
    }
    if (o.type === 'message_delta') addReason(facts, asObject(o.delta)?.stop_reason);
    return;
  }
  // responses: a whole Response, or an event carrying one (response.created, response.completed...).
  const response = typeof o.type === 'string' && o.type.startsWith('response.') ? asObject(o.response) : o.object === 'response' ? o : null;
  if (!response) return;
  facts.id ??= short(response.id);
  facts.model ??= short(response.model);
  const status = short(response.status);
  if (status !== null && status !== 'in_progress' && status !== 'queued') {
    facts.finishReasons = [short(asObject(response.incomplete_details)?.reason) ?? status];
  }
}

/** The facts of a whole answer. */
export function answerFacts(dialect: Dialect, body: Buffer): ResponseFacts {
  const facts = empty();
  const o = parse(body.toString('utf8'));
  if (o !== null) take(dialect, facts, o);
  return facts;
}

// The frames that can carry a fact: the rest (the bulk of a stream, its text deltas) are not parsed.
const CARRIES: Record<Dialect, RegExp> = {
  chat: /"finish_reason"\s*:\s*"/,
  messages: /"type"\s*:\s*"message_(start|delta)"/,
  responses: /"type"\s*:\s*"response\.(created|completed|incomplete|failed)"/,
};

/** Reads a stream's facts frame by frame: a chat stream's first chunk, and the frames that carry the rest. */
export function createStreamFacts(dialect: Dialect): { push(frame: Buffer): void; result(): ResponseFacts } {
  const facts = empty();
  let first = true;
  return {
    push(frame) {
      const text = frame.toString('utf8');
      if (!(first && dialect === 'chat') && !CARRIES[dialect].test(text)) return;
      const data = frameData(text);
      const o = data === null ? null : parse(data);
      if (o === null) return;
      first = false;
      take(dialect, facts, o);
    },
    result: () => facts,
  };
}
