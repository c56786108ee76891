// The request listing's filters (status, model, dialect, key, creation time range), parsed from query
// parameters into one value the database module turns into WHERE terms. Pure: no I/O.
import { ServiceError } from './errors.ts';
import { isId } from './ids.ts';
import { DIALECTS, isDialect, type Dialect } from './dialects.ts';

export const STATUSES = ['pending', 'running', 'succeeded', 'failed'] as const;
export type Status = (typeof STATUSES)[number];

export type ListingFilter = {
  status?: Status;
  model?: string;
  dialect?: Dialect;
  api_key_id?: string;
  /** Inclusive lower bound on created_at. */
  created_since?: Date;
  /** Exclusive upper bound on created_at. */
  created_before?: Date;
};

const FILTER_PARAMS = ['status', 'model', 'dialect', 'api_key_id', 'created_since', 'created_before'] as const;

const MAX_MODEL_CHARS = 512;
const ISO_RE = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})(?::(\d{2})(?:\.\d{1,3})?)?(?:Z|[+-](\d{2}):(\d{2}))$/;

/** Whether the ISO text names a real calendar date and time (Date.parse rolls 30 February over). */
function realDateTime(m: RegExpExecArray): boolean {
  const [y, mo, d, hh, mi, ss = '0', oh = '0', om = '0'] = m.slice(1);
  const day = new Date(Date.UTC(Number(y), Number(mo) - 1, Number(d)));
  return day.getUTCMonth() === Number(mo) - 1 && day.getUTCDate() === Number(d) && Number(hh) < 24 && Number(mi) < 60 && Number(ss) < 60 && Number(oh) < 24 && Number(om) < 60;
}

/** Epoch milliseconds, or an ISO 8601 timestamp with its offset (Z or ±hh:mm). */
export function parseInstant(name: string, value: string): Date {
  const iso = ISO_RE.exec(value);
  const ms = /^\d{1,15}$/.test(value) ? Number(value) : iso && realDateTime(iso) ? Date.parse(value) : NaN;
  if (!Number.isFinite(ms) || Number.isNaN(new Date(ms).getTime())) {
    throw new ServiceError('bad_request', `\`${name}\` must be epoch milliseconds or an ISO 8601 timestamp with its offset, such as 2026-01-31T12:00:00Z.`);
  }
  return new Date(ms);
}

/** The filter named by the query; `get` answers a parameter given once, or undefined. */
export function parseListingFilter(get: (name: string) => string | undefined): ListingFilter {
  const f: ListingFilter = {};
  const status = get('status');
  if (status !== undefined) {
    if (!(STATUSES as readonly string[]).includes(status)) throw new ServiceError('bad_request', `\`status\` must be one of ${STATUSES.join(', ')}.`);
    f.status = status as Status;
  }
  const model = get('model');
  if (model !== undefined) {
    if (model === '' || model.length > MAX_MODEL_CHARS || model.includes('\u0000')) {
      throw new ServiceError('bad_request', `\`model\` must be a model name of 1 to ${MAX_MODEL_CHARS} characters.`);
    }
    f.model = model;
  }
  const dialect = get('dialect');
  if (dialect !== undefined) {
    if (!isDialect(dialect)) throw new ServiceError('bad_request', `\`dialect\` must be one of ${DIALECTS.join(', ')}.`);
    f.dialect = dialect;
  }
  const key = get('api_key_id');
  if (key !== undefined) {
    if (!isId(key, 'key')) throw new ServiceError('bad_request', '`api_key_id` must be an API key id (key_...).');
    f.api_key_id = key;
  }
  for (const name of ['created_since', 'created_before'] as const) {
    const v = get(name);
    if (v !== undefined) f[name] = parseInstant(name, v);
  }
  return f;
}

/**
 * The scope a listing's cursors are signed for: the namespace and the filter, canonically, so
 * a cursor continues only the listing it came from. Without a filter it is the namespace
 * alone, as unfiltered cursors always were.
 */
export function cursorScope(namespaceId: string, f: ListingFilter): string {
  const parts = [namespaceId];
  for (const name of FILTER_PARAMS) {
    const v = f[name];
    if (v !== undefined) parts.push(`${name}=${v instanceof Date ? v.getTime() : v}`);
  }
  return parts.join('\0');
}
