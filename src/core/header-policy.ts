// Which caller headers reach the provider, and the header set of an upstream call (the rules:
// docs/api.md "Upstream headers", "Versioning", "Dialects"). Values are byte strings: node hands
// each byte over as one latin1 character and undici writes them back as latin1, so a value's
// length is its size on the wire and forwarding it sends the bytes that arrived.
import type { Dialect } from './tokens.ts';

export const ANTHROPIC_VERSION = '2023-06-01';
export const MAX_FORWARDED_VALUE_BYTES = 4096;
export const HOPS_HEADER = 'x-sarsen-hops';

const VENDOR_PREFIX = 'anthropic-';
const CHAT_VENDOR_HEADERS: ReadonlySet<string> = new Set(['openai-beta', 'openai-organization', 'openai-project']);
// A control character, or one above U+00FF: it cannot have come off the wire (nor survive latin1).
const NOT_FORWARDABLE_CHAR = /[\x00-\x1f\x7f\u0100-\uffff]/;

/** Whether a header (by lower-cased name) is one the provider may receive from the caller. */
export function isForwardableName(lowerName: string): boolean {
  if (CHAT_VENDOR_HEADERS.has(lowerName)) return true;
  return lowerName.startsWith(VENDOR_PREFIX) && lowerName !== 'anthropic-version';
}

/**
 * Whether a header value (a byte string, as node hands it over) may be sent on: at most
 * 4,096 bytes, no control character.
 */
export function isForwardableValue(value: string): boolean {
  return value.length <= MAX_FORWARDED_VALUE_BYTES && !NOT_FORWARDABLE_CHAR.test(value);
}

/**
 * The caller's headers to pass to the provider, from node's `req.rawHeaders`
 * (name, value, name, value...). Names are lower-cased; repeated headers are
 * kept, in arrival order. `dialect` does not change the answer (the docs name one list for
 * every dialect); it is taken so a per-dialect rule can be added without touching callers.
 */
export function forwardableHeaders(dialect: Dialect, rawHeaders: readonly string[]): [string, string][] {
  void dialect;
  const out: [string, string][] = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    const name = rawHeaders[i].toLowerCase();
    const value = rawHeaders[i + 1];
    if (isForwardableName(name) && isForwardableValue(value)) out.push([name, value]);
  }
  return out;
}

export type UpstreamHeaderOptions = {
  /** The backend's (or the caller's, for caller-credential backends) provider credential; null sends none. */
  credential: string | null;
  /** Output of forwardableHeaders. */
  forwarded: readonly [string, string][];
  /** The value to send: the arriving request's hops plus one. */
  hops: number;
  /** Byte length of the body that will be sent. */
  contentLength: number;
  /** `text/event-stream` for a streaming call, `application/json` otherwise. */
  accept: string;
};

/**
 * The header set of one upstream call. Sarsen's own headers come first and a
 * forwarded header can never replace one of them; repeated forwarded headers
 * are joined with ", " (the HTTP list form, which `anthropic-beta` uses).
 */
export function upstreamHeaders(dialect: Dialect, opts: UpstreamHeaderOptions): Record<string, string> {
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    accept: opts.accept,
    'content-length': String(opts.contentLength),
  };
  if (opts.credential !== null) {
    // The chat vendor's Responses API takes its key as Chat Completions does.
    if (dialect === 'messages') headers['x-api-key'] = opts.credential;
    else headers.authorization = `Bearer ${opts.credential}`;
  }
  if (dialect === 'messages') headers['anthropic-version'] = ANTHROPIC_VERSION;
  headers[HOPS_HEADER] = String(opts.hops);

  const own = new Set(Object.keys(headers));
  const extra = new Map<string, string>();
  for (const [rawName, value] of opts.forwarded) {
    const name = rawName.toLowerCase();
    // Re-checked: `forwarded` may have been stored and read back, not fresh from forwardableHeaders.
    if (own.has(name) || !isForwardableName(name) || !isForwardableValue(value)) continue;
    const before = extra.get(name);
    extra.set(name, before === undefined ? value : `${before}, ${value}`);
  }
  for (const [name, value] of extra) headers[name] = value;
  return headers;
}

/**
 * The re-route depth an arriving request carries in `x-sarsen-hops`. Missing,
 * empty or unreadable → 0: only Sarsen writes this header, so a value it cannot
 * read did not come from a Sarsen. When the header arrived more than once
 * (node joins repeats with ", ", or passes an array) the deepest readable value
 * counts, so a duplicated header cannot hide a loop. Digits only: no sign,
 * decimal point or exponent. An absurdly large value reads as
 * Number.MAX_SAFE_INTEGER, which is over any ceiling.
 */
export function parseHops(value: string | readonly string[] | undefined): number {
  if (value === undefined) return 0;
  const parts = (typeof value === 'string' ? [value] : value).flatMap((v) => v.split(','));
  let hops = 0;
  for (const part of parts) {
    const text = part.trim();
    if (!/^[0-9]+$/.test(text)) continue;
    hops = Math.max(hops, Math.min(Number(text), Number.MAX_SAFE_INTEGER));
  }
  return hops;
}
