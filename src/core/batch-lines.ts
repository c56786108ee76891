// A batch's lines, pure (docs/api.md "Batches"): splitting a JSONL input as it streams, and
// checking one line. A line that breaks the input's format fails the whole batch's validation
// (the vendor's `errors`, naming the line); a line whose body Sarsen would refuse (too large, a
// stream, no model) is kept, and ends refused as that line with the code Sarsen would answer.
import { parseCanonical, stringifyCanonical, isJsonObject, topLevelBoolean, type JsonValue } from './canonical-json.ts';
import { bodyModel } from './submission-body.ts';
import { ERROR_CODES, type ErrorCode } from './errors.ts';

export type LineError = { code: string; message: string; line: number | null; param: string | null };
/** How Sarsen refused a line, as the synchronous route would have answered its body. */
export type LineRefusal = { code: string; status: number; message: string };
/** A line as validation leaves it: waiting with its canonical body and model, or refused already (too large, streaming, no model). */
export type CheckedLine = {
  line: number;
  customId: string;
  model: string | null;
  body: string | null;
  refusal: LineRefusal | null;
};

/** Splits a byte stream into lines (LF or CRLF), holding only the unfinished one. */
export function createLineSplitter(): { feed(chunk: Buffer): Buffer[]; finish(): Buffer[] } {
  let rest: Buffer[] = [];
  const trim = (line: Buffer) => (line.length > 0 && line[line.length - 1] === 0x0d ? line.subarray(0, -1) : line);
  return {
    feed(chunk) {
      const lines: Buffer[] = [];
      let from = 0;
      for (let at = chunk.indexOf(0x0a); at !== -1; at = chunk.indexOf(0x0a, from)) {
        const piece = chunk.subarray(from, at);
        lines.push(trim(rest.length === 0 ? piece : Buffer.concat([...rest, piece])));
        rest = [];
        from = at + 1;
      }
      if (from < chunk.length) rest.push(Buffer.from(chunk.subarray(from)));
      return lines;
    },
    finish() {
      const last = rest.length === 0 ? [] : [trim(Buffer.concat(rest))];
      rest = [];
      return last;
    },
  };
}

const utf8 = new TextDecoder('utf-8', { fatal: true });
const refusal = (code: ErrorCode, message: string): LineRefusal => ({ code, status: ERROR_CODES[code].status, message });

/**
 * A request body as a line's: its canonical text and model, or the refusal Sarsen would answer
 * it with on the synchronous route (`maxBytes`: the submission limit).
 */
export function lineBody(value: JsonValue, line: number, customId: string, maxBytes: number): CheckedLine {
  const body = stringifyCanonical(value);
  const refuse = (code: ErrorCode, message: string): CheckedLine => ({ line, customId, model: null, body: null, refusal: refusal(code, message) });
  if (Buffer.byteLength(body) > maxBytes) return refuse('body_too_large', `The line's body is larger than ${maxBytes} bytes, the submission limit.`);
  const named = bodyModel(value);
  if ('refused' in named) return refuse('bad_request', named.refused);
  if (topLevelBoolean(value, 'stream') === true) return refuse('bad_request', 'A batch line cannot stream: its answer is read from the batch\'s results.');
  return { line, customId, model: named.model, body, refusal: null };
}

/** One line of an OpenAI batch input file, numbered from 1: the line, or why the input is invalid. */
export function checkOpenAILine(bytes: Buffer, line: number, endpoint: string, maxBytes: number): CheckedLine | LineError {
  const error = (code: string, message: string, param: string | null = null): LineError => ({ code, message, line, param });
  let value: JsonValue;
  try {
    value = parseCanonical(utf8.decode(bytes)).value;
  } catch {
    return error('invalid_json_line', `Line ${line} is not valid JSON.`);
  }
  if (!isJsonObject(value)) return error('invalid_json_line', `Line ${line} is not a JSON object.`);
  const customId = value.custom_id;
  if (typeof customId !== 'string' || customId.length === 0) return error('missing_required_parameter', `Line ${line} has no \`custom_id\` string.`, 'custom_id');
  // Stored as text, which cannot hold U+0000.
  if (customId.includes('\u0000') || customId.length > 512) return error('invalid_custom_id', `Line ${line}: \`custom_id\` must be at most 512 characters, without U+0000.`, 'custom_id');
  if (value.method !== 'POST') return error('invalid_method', `Line ${line}: \`method\` must be "POST".`, 'method');
  if (value.url !== endpoint) return error('mismatched_endpoint', `Line ${line}: \`url\` must be the batch's endpoint, ${endpoint}.`, 'url');
  const body = value.body;
  if (body === undefined || !isJsonObject(body)) return error('invalid_request', `Line ${line}: \`body\` must be a JSON object.`, 'body');
  return lineBody(body, line, customId, maxBytes);
}

export const isLineError = (x: CheckedLine | LineError): x is LineError => 'code' in x;

/** Parses a `completion_window` such as `24h` into milliseconds (Sarsen also takes shorter windows in s, m or h); null when malformed. */
export function windowMs(text: unknown): number | null {
  if (typeof text !== 'string') return null;
  const m = /^([1-9]\d{0,5})(s|m|h)$/.exec(text);
  if (!m) return null;
  const ms = Number(m[1]) * { s: 1000, m: 60_000, h: 3_600_000 }[m[2] as 's' | 'm' | 'h'];
  return ms <= 86_400_000 ? ms : null;
}
