// Canonical JSON for request bodies (docs/api.md "The canonical body", "Idempotency").
//
// One hand-written pass both builds the value and emits the canonical text, so a
// body is scanned once. Strings are located with indexOf (native, vectorised) and
// re-used verbatim whenever JSON.stringify would spell them the same way; only
// strings with unusual escapes or lone surrogates go through JSON.parse/stringify.
import { createHash } from 'node:crypto';

/** A JSON number kept as the exact lexeme it was written with (`1` ≠ `1.0`). */
export class JsonNumber {
  readonly lexeme: string;
  constructor(lexeme: string) {
    this.lexeme = lexeme;
    Object.freeze(this);
  }
}

export type JsonValue = null | boolean | string | JsonNumber | JsonValue[] | { [k: string]: JsonValue };
export type JsonObject = { [k: string]: JsonValue };

/** Malformed JSON; `position` is the UTF-16 offset where parsing stopped. */
export class CanonicalJsonError extends Error {
  readonly position: number;
  constructor(message: string, position: number) {
    super(`${message} at position ${position}`);
    this.name = 'CanonicalJsonError';
    this.position = position;
  }
}

// Nesting deeper than this is refused rather than risking a stack overflow (a
// RangeError would surface as a 500); no real chat body comes near it.
const MAX_DEPTH = 512;

const NUMBER_RE = /^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?$/;

interface Scanner {
  src: string;
  pos: number;
  depth: number;
  /** Whether the value just parsed is already canonical as written, i.e. its
   * canonical text is the source slice it spans; copying runs of the source keeps
   * the output rope short, which is most of the serialising cost. */
  verbatim: boolean;
  /** Canonical text of the value just parsed, when it is not verbatim. */
  text: string;
  /** Cached positions of the next quote / backslash / control char at or after
   * the current string; re-searched only once passed, keeping scans linear. */
  nextQuote: number;
  nextSlash: number;
  nextCtl: number;
  ctlRe: RegExp;
  wellFormed: boolean;
}

export function parseCanonical(text: string): { value: JsonValue; text: string } {
  const s: Scanner = {
    src: text, pos: 0, depth: 0, verbatim: false, text: '',
    nextQuote: -1, nextSlash: -1, nextCtl: -1,
    ctlRe: /[\u0000-\u001f]/g,
    // A whole text without lone surrogates cannot hide one inside a string.
    wellFormed: text.isWellFormed(),
  };
  skipWs(s);
  const start = s.pos;
  const value = parseValue(s);
  const canonical = textOf(s, start);
  skipWs(s);
  if (s.pos !== text.length) fail(s, 'Unexpected data after JSON value');
  return { value, text: canonical };
}

function fail(s: Scanner, message: string, at = s.pos): never {
  throw new CanonicalJsonError(message, at);
}

function textOf(s: Scanner, start: number): string {
  return s.verbatim ? s.src.slice(start, s.pos) : s.text;
}

/** Skips whitespace; true when there was some. */
function skipWs(s: Scanner): boolean {
  const src = s.src;
  let p = s.pos;
  let c = src.charCodeAt(p);
  if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) return false;
  do c = src.charCodeAt(++p); while (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09);
  s.pos = p;
  return true;
}

/** Parses the value at s.pos (no leading whitespace). */
function parseValue(s: Scanner): JsonValue {
  const c = s.src.charCodeAt(s.pos);
  if (c === 0x22) return parseString(s);
  if (c === 0x7b) return parseObject(s);
  if (c === 0x5b) return parseArray(s);
  s.verbatim = true;
  if (c === 0x2d || (c >= 0x30 && c <= 0x39)) return parseNumber(s);
  if (c === 0x74) return parseLiteral(s, 'true', true);
  if (c === 0x66) return parseLiteral(s, 'false', false);
  if (c === 0x6e) return parseLiteral(s, 'null', null);
  return fail(s, Number.isNaN(c) ? 'Unexpected end of JSON input' : 'Unexpected token');
}

function parseLiteral<T extends JsonValue>(s: Scanner, word: string, value: T): T {
  if (!s.src.startsWith(word, s.pos)) fail(s, 'Unexpected token');
  s.pos += word.length;
  return value;
}

function parseNumber(s: Scanner): JsonNumber {
  const src = s.src;
  const start = s.pos;
  let p = start;
  let c = src.charCodeAt(p);
  if (c === 0x2d) c = src.charCodeAt(++p);
  if (c === 0x30) c = src.charCodeAt(++p);
  else if (c >= 0x31 && c <= 0x39) { do c = src.charCodeAt(++p); while (c >= 0x30 && c <= 0x39); }
  else fail(s, 'No digits in number', p);
  if (c === 0x2e) {
    const digits = ++p;
    c = src.charCodeAt(p);
    while (c >= 0x30 && c <= 0x39) c = src.charCodeAt(++p);
    if (p === digits) fail(s, 'No digits after decimal point', p);
  }
  if (c === 0x65 || c === 0x45) {
    c = src.charCodeAt(++p);
    if (c === 0x2b || c === 0x2d) c = src.charCodeAt(++p);
    const digits = p;
    while (c >= 0x30 && c <= 0x39) c = src.charCodeAt(++p);
    if (p === digits) fail(s, 'No digits in exponent', p);
  }
  s.pos = p;
  return new JsonNumber(src.slice(start, p));
}

function parseString(s: Scanner): string {
  const src = s.src;
  const start = s.pos;
  let i = start + 1;
  let escaped = false;
  // JSON.stringify writes only \" \\ \b \f \n \r \t and lowercase \u00xx/\udxxx;
  // \u escapes and \/ may differ from that, so such strings are re-spelled.
  let respell = false;
  let end: number;
  for (;;) {
    if (s.nextQuote < i) {
      s.nextQuote = src.indexOf('"', i);
      if (s.nextQuote === -1) fail(s, 'Unterminated string', start);
    }
    if (s.nextSlash < i) {
      const b = src.indexOf('\\', i);
      s.nextSlash = b === -1 ? src.length : b;
    }
    if (s.nextQuote < s.nextSlash) { end = s.nextQuote; break; }
    const b = s.nextSlash;
    const e = src.charCodeAt(b + 1);
    if (e === 0x75 || e === 0x2f) respell = true;
    else if (e !== 0x22 && e !== 0x5c && e !== 0x6e && e !== 0x74 && e !== 0x72 && e !== 0x62 && e !== 0x66) {
      fail(s, Number.isNaN(e) ? 'Unterminated string' : 'Bad escaped character', b);
    }
    escaped = true;
    i = b + 2;
  }
  if (s.nextCtl < start) {
    s.ctlRe.lastIndex = start;
    const m = s.ctlRe.exec(src);
    s.nextCtl = m === null ? src.length : m.index;
  }
  if (s.nextCtl < end) fail(s, 'Bad control character in string literal', s.nextCtl);
  s.pos = end + 1;
  let value: string;
  if (!escaped) {
    value = src.slice(start + 1, end);
  } else {
    try {
      value = JSON.parse(src.slice(start, end + 1)) as string;
    } catch {
      return fail(s, 'Bad Unicode escape', start);
    }
  }
  s.verbatim = !respell && (s.wellFormed || src.slice(start + 1, end).isWellFormed());
  if (!s.verbatim) s.text = JSON.stringify(value);
  return value;
}

/** Steps into an array or object; true when whitespace follows the bracket. */
function enter(s: Scanner): boolean {
  if (++s.depth > MAX_DEPTH) fail(s, `Nesting deeper than ${MAX_DEPTH}`);
  s.pos++;
  return skipWs(s);
}

function parseArray(s: Scanner): JsonValue[] {
  const src = s.src;
  const start = s.pos;
  const out: JsonValue[] = [];
  // null while everything so far is canonical as written (= src.slice(start, s.pos)).
  let text: string | null = enter(s) ? '[' : null;
  if (src.charCodeAt(s.pos) !== 0x5d) {
    for (;;) {
      const at = s.pos;
      out.push(parseValue(s));
      if (text !== null) text += textOf(s, at);
      else if (!s.verbatim) text = src.slice(start, at) + s.text;
      const before = s.pos;
      if (skipWs(s) && text === null) text = src.slice(start, before);
      const c = src.charCodeAt(s.pos);
      if (c === 0x5d) break;
      if (c !== 0x2c) fail(s, "Expected ',' or ']' after array element");
      s.pos++;
      if (text !== null) text += ',';
      if (skipWs(s) && text === null) text = src.slice(start, before + 1);
    }
  }
  s.pos++;
  s.depth--;
  s.verbatim = text === null;
  if (text !== null) s.text = text + ']';
  return out;
}

function parseObject(s: Scanner): JsonObject {
  const src = s.src;
  const start = s.pos;
  const out: JsonObject = {};
  const keys: string[] = [];
  // Each member's canonical `"key":value` text.
  const members: string[] = [];
  let compact = !enter(s);
  let sorted = true;
  if (src.charCodeAt(s.pos) !== 0x7d) {
    for (;;) {
      const at = s.pos;
      if (src.charCodeAt(at) !== 0x22) fail(s, 'Expected property name');
      const key = parseString(s);
      const keyVerbatim = s.verbatim;
      const keyText = keyVerbatim ? '' : s.text;
      const keyEnd = s.pos;
      let spaced = skipWs(s);
      if (src.charCodeAt(s.pos) !== 0x3a) fail(s, "Expected ':' after property name");
      s.pos++;
      spaced = skipWs(s) || spaced;
      const valueAt = s.pos;
      const value = parseValue(s);
      if (keyVerbatim && !spaced && s.verbatim) members.push(src.slice(at, s.pos));
      else members.push((keyVerbatim ? src.slice(at, keyEnd) : keyText) + ':' + textOf(s, valueAt));
      compact &&= keyVerbatim && !spaced && s.verbatim;
      setMember(out, key, value);
      if (sorted && keys.length > 0 && !(keys[keys.length - 1] < key)) sorted = false;
      keys.push(key);
      if (skipWs(s)) compact = false;
      const c = src.charCodeAt(s.pos);
      if (c === 0x7d) break;
      if (c !== 0x2c) fail(s, "Expected ',' or '}' after property value");
      s.pos++;
      if (skipWs(s)) compact = false;
    }
  }
  s.pos++;
  s.depth--;
  s.verbatim = compact && sorted;
  if (!s.verbatim) s.text = sorted ? joinMembers(members) : joinSorted(keys, members);
  return out;
}

// `out[key] = v` would set the prototype for "__proto__"; JSON.parse makes it an own property.
function setMember(out: JsonObject, key: string, value: JsonValue): void {
  if (key === '__proto__') Object.defineProperty(out, key, { value, writable: true, enumerable: true, configurable: true });
  else out[key] = value;
}

/** Object text from member texts in key order (UTF-16 code units), keeping the last
 * of duplicated keys; reorders `keys` and `members` in place. */
function joinSorted(keys: string[], members: string[]): string {
  const n = keys.length;
  // Large (possibly hostile) objects stay n log n; most unsorted objects are a handful
  // of keys, where a stable insertion sort in place is cheapest.
  if (n > 16) {
    const last = new Map<string, string>();
    for (let i = 0; i < n; i++) last.set(keys[i], members[i]);
    const order = [...last.keys()].sort();
    return joinMembers(order.map((k) => last.get(k) as string));
  }
  for (let i = 1; i < n; i++) {
    const key = keys[i];
    const member = members[i];
    let j = i;
    while (j > 0 && keys[j - 1] > key) {
      keys[j] = keys[j - 1];
      members[j] = members[j - 1];
      j--;
    }
    keys[j] = key;
    members[j] = member;
  }
  let text = '{';
  for (let i = 0; i < n; i++) {
    if (i + 1 < n && keys[i + 1] === keys[i]) continue; // a later duplicate follows and wins
    text += (text.length === 1 ? '' : ',') + members[i];
  }
  return text + '}';
}

function joinMembers(members: string[]): string {
  if (members.length === 0) return '{}';
  let text = '{' + members[0];
  for (let i = 1; i < members.length; i++) text += ',' + members[i];
  return text + '}';
}

export function stringifyCanonical(value: JsonValue): string {
  return emit(value, 0);
}

function emit(value: JsonValue, depth: number): string {
  if (value === null) return 'null';
  switch (typeof value) {
    case 'string': return JSON.stringify(value);
    case 'boolean': return value ? 'true' : 'false';
    case 'object': break;
    default: throw new TypeError(`Not a JsonValue: ${typeof value}`);
  }
  if (value instanceof JsonNumber) return value.lexeme;
  if (depth >= MAX_DEPTH) throw new TypeError(`JsonValue nested deeper than ${MAX_DEPTH}`);
  if (Array.isArray(value)) {
    let text = '[';
    for (let i = 0; i < value.length; i++) text += (i === 0 ? '' : ',') + emit(value[i], depth + 1);
    return text + ']';
  }
  const keys = Object.keys(value).sort();
  let text = '{';
  for (let i = 0; i < keys.length; i++) {
    text += (i === 0 ? '' : ',') + JSON.stringify(keys[i]) + ':' + emit(value[keys[i]], depth + 1);
  }
  return text + '}';
}

/** Canonical text of `value` (an object) with `key` set to `replacement`; `value` is untouched. */
export function withTopLevelField(value: JsonValue, key: string, replacement: JsonValue): string {
  if (!isJsonObject(value)) throw new TypeError('withTopLevelField needs a JSON object');
  const keys = Object.keys(value);
  if (!Object.hasOwn(value, key)) keys.push(key);
  keys.sort();
  let text = '{';
  for (let i = 0; i < keys.length; i++) {
    const k = keys[i];
    text += (i === 0 ? '' : ',') + JSON.stringify(k) + ':' + emit(k === key ? replacement : value[k], 1);
  }
  return text + '}';
}

export function isJsonObject(value: JsonValue): value is JsonObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value) && !(value instanceof JsonNumber);
}

export function isJsonNumber(value: unknown): value is JsonNumber {
  return value instanceof JsonNumber;
}

export function jsonString(s: string): JsonValue {
  return s;
}

/** A JsonNumber from a lexeme, which must be valid JSON number syntax. */
export function jsonNumber(lexeme: string): JsonNumber {
  if (!NUMBER_RE.test(lexeme)) throw new TypeError(`Not a JSON number: ${JSON.stringify(lexeme)}`);
  return new JsonNumber(lexeme);
}

export function topLevelString(value: JsonValue, key: string): string | undefined {
  if (!isJsonObject(value) || !Object.hasOwn(value, key)) return undefined;
  const v = value[key];
  return typeof v === 'string' ? v : undefined;
}

export function topLevelBoolean(value: JsonValue, key: string): boolean | undefined {
  if (!isJsonObject(value) || !Object.hasOwn(value, key)) return undefined;
  const v = value[key];
  return typeof v === 'boolean' ? v : undefined;
}

/**
 * Hex SHA-256 identifying a submission. Each part is written as its UTF-8 byte
 * length, ':', then its bytes, and an absent credential as a distinct marker, so
 * no two different part tuples produce the same hashed byte stream.
 */
export function identityHash(parts: { dialect: string; canonicalText: string; credentialHash?: string }): string {
  const h = createHash('sha256');
  h.update('sarsen-identity-v1\n');
  writePart(h, parts.dialect);
  writePart(h, parts.canonicalText);
  if (parts.credentialHash === undefined) h.update('-');
  else { h.update('+'); writePart(h, parts.credentialHash); }
  return h.digest('hex');
}

function writePart(h: ReturnType<typeof createHash>, part: string): void {
  // Lone surrogates would all encode as U+FFFD and collide; canonical text never has them.
  if (!part.isWellFormed()) throw new TypeError('identityHash parts must be well-formed UTF-16');
  const bytes = Buffer.from(part, 'utf8');
  h.update(`${bytes.length}:`);
  h.update(bytes);
}
