// The vendors' batch shapes (docs/api.md "Batches"), pure: OpenAI's Batch and its output and
// error file lines, Anthropic's MessageBatch and its result lines (in Anthropic's error body,
// src/core/vendor-api.ts). A result line embeds the request's stored answer byte for byte
// (docs/api.md "Batches": only line breaks a provider put between JSON tokens are dropped, so
// each result stays one line).
import { anthropicErrorBody } from './vendor-api.ts';

/**
 * A line's state as read (src/db/batches.ts): its own while it never became a request (waiting,
 * refused, canceled, expired); once dispatched, its request's: running until the request ends,
 * then how it ended.
 */
export type LineState = 'waiting' | 'running' | 'succeeded' | 'failed' | 'refused' | 'canceled' | 'expired';
export type Counts = Record<LineState, number>;

/** What a batch's state is made of (a row of src/db/batches.ts, without the database types). */
export type BatchState = {
  id: string;
  endpoint: string;
  input_file_id: string | null;
  completion_window: string;
  metadata: Record<string, string> | null;
  errors: { code: string; message: string; line: number | null; param: string | null }[] | null;
  total: number;
  created_at: Date;
  expires_at: Date;
  cancelling_at: Date | null;
  expired_at: Date | null;
  finalizing_at: Date | null;
  ended_at: Date | null;
  output_file_id: string | null;
  error_file_id: string | null;
  counts: Counts;
};

/** A line as a result is built from it: its end and, when it ran, its request's stored answer (`swept`: retention removed it). */
export type EndedLine = {
  line: number;
  custom_id: string;
  state: LineState;
  request_id: string | null;
  error_code: string | null;
  error_status: number | null;
  error_message: string | null;
  answer_status: number | null;
  answer: Buffer | null;
  swept: boolean;
};

const seconds = (d: Date | null) => (d === null ? null : Math.floor(d.getTime() / 1000));

export type OpenAIStatus = 'validating' | 'failed' | 'in_progress' | 'finalizing' | 'completed' | 'expired' | 'cancelling' | 'cancelled';

export function openaiStatus(b: BatchState): OpenAIStatus {
  if (b.errors !== null) return 'failed';
  if (b.ended_at !== null) return b.cancelling_at !== null ? 'cancelled' : b.expired_at !== null ? 'expired' : 'completed';
  if (b.cancelling_at !== null) return 'cancelling';
  if (b.finalizing_at !== null) return 'finalizing';
  return 'in_progress';
}

/**
 * OpenAI's Batch. `failed` counts every line in the error file: refused by Sarsen or the
 * provider, and the lines a cancel or the window ended before they ran, so that once the batch
 * ends `completed + failed = total`.
 */
export function openaiBatch(b: BatchState) {
  const status = openaiStatus(b);
  const c = b.counts;
  return {
    id: b.id,
    object: 'batch',
    endpoint: b.endpoint,
    errors: b.errors === null ? null : { object: 'list', data: b.errors },
    input_file_id: b.input_file_id,
    completion_window: b.completion_window,
    status,
    output_file_id: b.output_file_id,
    error_file_id: b.error_file_id,
    created_at: seconds(b.created_at),
    in_progress_at: b.errors === null ? seconds(b.created_at) : null,
    expires_at: seconds(b.expires_at),
    finalizing_at: seconds(b.finalizing_at),
    completed_at: status === 'completed' ? seconds(b.ended_at) : null,
    failed_at: status === 'failed' ? seconds(b.created_at) : null,
    expired_at: seconds(b.expired_at),
    cancelling_at: seconds(b.cancelling_at),
    cancelled_at: status === 'cancelled' ? seconds(b.ended_at) : null,
    request_counts: { total: b.total, completed: c.succeeded, failed: c.failed + c.refused + c.canceled + c.expired },
    metadata: b.metadata,
  };
}

/** Anthropic's MessageBatch; `resultsUrl` is where its results are once it ended. */
export function anthropicBatch(b: BatchState, resultsUrl: string) {
  const c = b.counts;
  const iso = (d: Date | null) => (d === null ? null : d.toISOString());
  return {
    id: b.id,
    type: 'message_batch',
    processing_status: b.ended_at !== null ? 'ended' : b.cancelling_at !== null ? 'canceling' : 'in_progress',
    request_counts: { processing: c.waiting + c.running, succeeded: c.succeeded, errored: c.failed + c.refused, canceled: c.canceled, expired: c.expired },
    ended_at: iso(b.ended_at),
    created_at: iso(b.created_at)!,
    expires_at: iso(b.expires_at)!,
    archived_at: null,
    cancel_initiated_at: iso(b.cancelling_at),
    results_url: b.ended_at !== null ? resultsUrl : null,
  };
}

/** A stored answer as one line of JSON: byte for byte, less line breaks between tokens; a body that is not JSON, as a string. */
export function answerJson(answer: Buffer | null): string {
  if (answer === null) return 'null';
  const text = answer.toString('utf8');
  try {
    JSON.parse(text);
  } catch {
    return JSON.stringify(text);
  }
  // JSON strings cannot hold a raw line break: any in valid JSON lies between tokens.
  return /[\r\n]/.test(text) ? text.replace(/[\r\n]/g, '') : text;
}

/** Whether a line's result carries its successful answer (Anthropic's `succeeded`). */
export const succeeded = (l: EndedLine) => l.state === 'succeeded' && !l.swept && l.answer !== null;

/**
 * Which of an OpenAI batch's files holds a line: decided by how it ended, so a line stays in its
 * file when retention sweeps its answer (its result then says `record_expired`), and
 * `request_counts` always count the files' lines.
 */
export const openaiFileOf = (l: EndedLine): 'output' | 'error' => (l.state === 'succeeded' ? 'output' : 'error');

/**
 * A line's size in its OpenAI file, as written now and as written once retention swept its
 * answer: recorded when the batch ends, so a file's `bytes` is summed from what its lines hold.
 */
export function openaiLineBytes(batchId: string, l: EndedLine): { result: number; swept: number } {
  const result = Buffer.byteLength(openaiResultLine(batchId, l));
  if (l.request_id === null || l.swept || l.answer === null) return { result, swept: result };
  return { result, swept: Buffer.byteLength(openaiResultLine(batchId, { ...l, answer_status: null, answer: null, swept: true })) };
}

/** The error a line without a provider answer ends with: Sarsen's code and message. */
function ownError(l: EndedLine): { code: string; message: string; status: number | null } {
  if (l.state === 'canceled') return { code: 'batch_cancelled', message: 'The batch was cancelled before this line ran.', status: null };
  if (l.state === 'expired') return { code: 'batch_expired', message: 'The batch\'s completion window ended before this line ran.', status: null };
  if (l.state === 'refused') return { code: l.error_code!, message: l.error_message ?? '', status: l.error_status };
  return { code: 'record_expired', message: 'The line ran, but its stored answer was removed by retention.', status: 410 };
}

/** One line of an OpenAI output or error file. */
export function openaiResultLine(batchId: string, l: EndedLine): string {
  const id = JSON.stringify(`batch_req_${batchId.replace(/^batch_/, '')}_${l.line}`);
  const customId = JSON.stringify(l.custom_id);
  const ran = (l.state === 'succeeded' || l.state === 'failed') && !l.swept && l.answer !== null;
  if (ran) {
    return `{"id":${id},"custom_id":${customId},"response":{"status_code":${l.answer_status},"request_id":${JSON.stringify(l.request_id)},"body":${answerJson(l.answer)}},"error":null}\n`;
  }
  const e = ownError(l);
  const response = e.status === null ? 'null' : `{"status_code":${e.status},"request_id":${JSON.stringify(l.request_id)},"body":${JSON.stringify({ error: { code: e.code, message: e.message } })}}`;
  return `{"id":${id},"custom_id":${customId},"response":${response},"error":${JSON.stringify({ code: e.code, message: e.message })}}\n`;
}

/** One line of an Anthropic results file. */
export function anthropicResultLine(l: EndedLine): string {
  const customId = JSON.stringify(l.custom_id);
  if (l.state === 'canceled' || l.state === 'expired') return `{"custom_id":${customId},"result":{"type":"${l.state}"}}\n`;
  if (succeeded(l)) return `{"custom_id":${customId},"result":{"type":"succeeded","message":${answerJson(l.answer)}}}\n`;
  if (l.state === 'failed' && !l.swept && l.answer !== null) {
    const error = answerJson(l.answer);
    const own = sarsenEnvelope(error);
    // The provider's refusal verbatim; a failure Sarsen stored itself (its own envelope: the
    // provider unreachable, a cancel) or a body that is no object, in the vendor's shape.
    const body = own !== null
      ? anthropicErrorBody(own.code, l.answer_status ?? 502, own.message)
      : error.startsWith('{') ? error : anthropicErrorBody('upstream_failed', l.answer_status ?? 502, String(JSON.parse(error)));
    return `{"custom_id":${customId},"result":{"type":"errored","error":${body}}}\n`;
  }
  const e = ownError(l);
  return `{"custom_id":${customId},"result":{"type":"errored","error":${anthropicErrorBody(e.code, e.status ?? 500, e.message)}}}\n`;
}

/** Sarsen's own error envelope, `{"error": {"code", "message"}}` and nothing else, or null. */
function sarsenEnvelope(json: string): { code: string; message: string } | null {
  if (!json.startsWith('{"error":{"code":')) return null;
  try {
    const v = JSON.parse(json) as { error?: { code?: unknown; message?: unknown } };
    const keys = Object.keys(v);
    const inner = v.error && typeof v.error === 'object' ? Object.keys(v.error) : [];
    if (keys.length !== 1 || inner.length !== 2 || typeof v.error!.code !== 'string' || typeof v.error!.message !== 'string') return null;
    return { code: v.error!.code, message: v.error!.message };
  } catch {
    return null;
  }
}
