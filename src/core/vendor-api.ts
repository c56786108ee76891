// The vendors' own APIs on the wire, in one place (docs/api.md "Errors", "Background responses",
// "Batches"): their error bodies, so their SDKs raise their own classes; their list pages and
// list parameters; the metadata a batch takes. Each route of a vendor's API takes its shapes from
// here. Pure: no I/O.
import { ServiceError } from './errors.ts';

/** OpenAI's error body, keeping Sarsen's stable code in `code` (docs/api.md "Errors"). */
export function openaiErrorBody(code: string, status: number, message: string): string {
  const type = status === 401 ? 'authentication_error' : status === 403 ? 'permission_error' : status === 404 ? 'not_found_error' : status === 429 ? 'rate_limit_error' : status >= 500 ? 'server_error' : 'invalid_request_error';
  return JSON.stringify({ error: { message, type, param: null, code } });
}

/** Anthropic's error type for an HTTP status (its error classes follow the status). */
export function anthropicErrorType(status: number): string {
  switch (status) {
    case 400: case 413: case 415: case 422: return status === 413 ? 'request_too_large' : 'invalid_request_error';
    case 401: return 'authentication_error';
    case 402: return 'billing_error';
    case 403: return 'permission_error';
    case 404: case 410: return 'not_found_error';
    case 429: return 'rate_limit_error';
    case 529: return 'overloaded_error';
    default: return status >= 500 ? 'api_error' : 'invalid_request_error';
  }
}

/** Anthropic's error body; `code` is Sarsen's own code, beside the vendor's type. */
export function anthropicErrorBody(code: string, status: number, message: string): string {
  return JSON.stringify({ type: 'error', error: { type: anthropicErrorType(status), message, code } });
}

/**
 * A `limit` query parameter from 1 to `max`, `fallback` when absent; anything else is refused,
 * never clamped. Sarsen's own listings take the same rule (with their own range).
 */
export function parseLimit(value: unknown, fallback: number, max: number): number {
  if (value === undefined) return fallback;
  const n = typeof value === 'string' && /^\d{1,15}$/.test(value) ? Number(value) : NaN;
  if (!(n >= 1 && n <= max)) throw new ServiceError('bad_request', `\`limit\` must be an integer from 1 to ${max}.`);
  return n;
}

/** An `order` query parameter: `asc` or `desc`, `desc` when absent. */
export function parseOrder(value: unknown): 'asc' | 'desc' {
  if (value === undefined) return 'desc';
  if (value !== 'asc' && value !== 'desc') throw new ServiceError('bad_request', '`order` must be `asc` or `desc`.');
  return value;
}

/** An id query parameter (`after`, `after_id`, `before_id`, `purpose`), or null when absent. */
export function parseId(value: unknown, name: string): string | null {
  if (value === undefined) return null;
  if (typeof value !== 'string' || value.length > 200) throw new ServiceError('bad_request', `\`${name}\` must be an id.`);
  return value;
}

/** A non-negative integer query parameter (a position, such as `starting_after`), or null when absent. */
export function parseCount(value: unknown, name: string): number | null {
  if (value === undefined) return null;
  if (typeof value !== 'string' || !/^\d{1,15}$/.test(value)) throw new ServiceError('bad_request', `\`${name}\` must be a non-negative integer.`);
  return Number(value);
}

type Listed = { id: string };

/**
 * OpenAI's list page from up to `limit + 1` rows in the list's order (one more than the page
 * tells that there are more): `data` the rows shown as `show` shows them.
 */
export function openaiList<T extends Listed>(rows: readonly T[], limit: number, show: (row: T) => unknown = (row) => row) {
  const page = rows.slice(0, limit);
  return { object: 'list', data: page.map(show), first_id: page[0]?.id ?? null, last_id: page.at(-1)?.id ?? null, has_more: rows.length > limit };
}

/**
 * Anthropic's list page, as openaiList reads its rows. A page before `before_id` is read away
 * from it, so its page is the last `limit` rows: the ones nearest to it.
 */
export function anthropicList<T extends Listed>(rows: readonly T[], limit: number, show: (row: T) => unknown, before: boolean) {
  const page = before && rows.length > limit ? rows.slice(rows.length - limit) : rows.slice(0, limit);
  return { data: page.map(show), has_more: rows.length > limit, first_id: page[0]?.id ?? null, last_id: page.at(-1)?.id ?? null };
}

/** Metadata as OpenAI takes it: up to 16 string values, or null. */
export function metadataOf(value: unknown): Record<string, string> | null {
  if (value === undefined || value === null) return null;
  const ok = typeof value === 'object' && !Array.isArray(value) && Object.keys(value).length <= 16 &&
    Object.entries(value).every(([k, v]) => k.length <= 64 && typeof v === 'string' && v.length <= 512 && !`${k}${v}`.includes('\u0000'));
  if (!ok) throw new ServiceError('bad_request', '`metadata` must be an object of at most 16 string values.');
  return value as Record<string, string>;
}
