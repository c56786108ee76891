// When a provider answer is worth another attempt, and how long to wait
// (docs/api.md "Outcomes and retries"; settings retry_base_ms, retry_max_ms, max_attempts).
//
// Retryable: a transport failure before any response (the caller's decision: no
// status exists), and the statuses below. Anything else the provider answers is
// a refusal, terminal at once.

const RETRYABLE_STATUSES: ReadonlySet<number> = new Set([408, 429, 500, 502, 503, 504, 529]);

/**
 * The longest wait a provider's `retry-after` can impose. Above `retry_max_ms`
 * the provider's word still wins (retrying earlier only earns another 429), but
 * not without bound: a typo or hostile value must not park a request for days.
 */
export const RETRY_AFTER_CEILING_MS = 60 * 60 * 1000;

export function isRetryableStatus(status: number): boolean {
  return RETRYABLE_STATUSES.has(status);
}

const DELTA_SECONDS = /^[0-9]+(?:\.[0-9]+)?$/;
const DAYS = '(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)';
const LONG_DAYS = '(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)';
const MONTHS = ['jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct', 'nov', 'dec'];
const MONTH = '(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)';
const TIME = '([0-9]{2}):([0-9]{2}):([0-9]{2})';
// The three HTTP-date forms of RFC 9110 5.6.7, matched case-insensitively as a lenient recipient.
const IMF_FIXDATE = new RegExp(`^${DAYS}, ([0-9]{2}) ${MONTH} ([0-9]{4}) ${TIME} GMT$`, 'i');
const RFC850_DATE = new RegExp(`^${LONG_DAYS}, ([0-9]{2})-${MONTH}-([0-9]{2}) ${TIME} GMT$`, 'i');
const ASCTIME_DATE = new RegExp(`^${DAYS} ${MONTH} ([0-9 ][0-9]) ${TIME} ([0-9]{4})$`, 'i');

/**
 * The wait a `retry-after` value asks for, in milliseconds from `now` (epoch
 * ms): delta-seconds (decimals accepted), or an HTTP-date (a past date gives
 * 0). Null when absent or unreadable.
 */
export function parseRetryAfter(value: string | undefined, now: number): number | null {
  if (value === undefined) return null;
  const text = value.trim();
  if (DELTA_SECONDS.test(text)) {
    const ms = Math.ceil(Number(text) * 1000);
    return Number.isFinite(ms) ? ms : null;
  }
  const at = parseHttpDate(text, now);
  return at === null ? null : Math.max(0, at - now);
}

/**
 * An HTTP-date as epoch ms, or null. The weekday name is not checked against the
 * date. `now` (epoch ms) places the two-digit years of the obsolete RFC 850 form.
 */
export function parseHttpDate(text: string, now: number): number | null {
  let m = IMF_FIXDATE.exec(text);
  if (m !== null) return utc(+m[3], m[2], +m[1], +m[4], +m[5], +m[6]);
  m = RFC850_DATE.exec(text);
  if (m !== null) return utc(twoDigitYear(+m[3], now), m[2], +m[1], +m[4], +m[5], +m[6]);
  m = ASCTIME_DATE.exec(text);
  if (m !== null) return utc(+m[6], m[1], +m[2].trim(), +m[3], +m[4], +m[5]);
  return null;
}

// RFC 9110: a two-digit year more than 50 years in the future means the past century.
function twoDigitYear(yy: number, now: number): number {
  const thisYear = new Date(now).getUTCFullYear();
  let year = Math.floor(thisYear / 100) * 100 + yy;
  if (year > thisYear + 50) year -= 100;
  return year;
}

function utc(year: number, monthName: string, day: number, hour: number, minute: number, second: number): number | null {
  const month = MONTHS.indexOf(monthName.toLowerCase());
  const daysInMonth = new Date(Date.UTC(year, month + 1, 0)).getUTCDate();
  // Refuse what Date.UTC would silently roll over (31 Feb → 3 Mar). A second of
  // 60 (leap second) is allowed and becomes the next minute's first.
  if (day < 1 || day > daysInMonth || hour > 23 || minute > 59 || second > 60) return null;
  return Date.UTC(year, month, day, hour, minute, second);
}

export type BackoffOptions = {
  /** The attempt that just failed, counting from 1. */
  attempt: number;
  /** retry_base_ms: the delay ceiling after the first attempt. */
  baseMs: number;
  /** retry_max_ms: the largest backoff Sarsen chooses on its own. */
  maxMs: number;
  /** From parseRetryAfter, or null when the provider sent none. */
  retryAfterMs: number | null;
  /** [0, 1); injectable for tests. */
  random?: () => number;
};

/**
 * Delay before the next attempt. Exponential backoff, ceiling
 * min(maxMs, baseMs * 2^(attempt-1)), with equal jitter: a uniform pick in
 * [ceiling/2, ceiling]. Equal rather than full jitter so that a provider which
 * just said 503 is never retried at once, while retries still spread out.
 * A provider's retry-after is a floor: the delay is at least that, even above
 * maxMs, up to RETRY_AFTER_CEILING_MS.
 */
export function nextDelayMs(opts: BackoffOptions): number {
  const random = opts.random ?? Math.random;
  const attempt = Math.max(1, Math.floor(opts.attempt) || 1);
  const base = Math.max(0, opts.baseMs);
  const max = Math.max(0, opts.maxMs);
  // 2 ** big is Infinity, and Math.min then settles on max; base 0 stays 0.
  const ceiling = base === 0 ? 0 : Math.min(max, base * 2 ** (attempt - 1));
  const r = Math.min(Math.max(random(), 0), 1);
  const backoff = Math.floor(ceiling / 2 + r * (ceiling / 2));
  if (opts.retryAfterMs === null || !(opts.retryAfterMs > 0)) return backoff;
  return Math.max(backoff, Math.min(Math.ceil(opts.retryAfterMs), RETRY_AFTER_CEILING_MS));
}
