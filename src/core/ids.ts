// Prefixed, sortable identifiers: `${prefix}_${ulid}` (docs/api.md "Identifiers and formats").
// A ULID is 26 Crockford base32 characters: 10 for a 48-bit millisecond timestamp,
// 16 for 80 random bits. Within one millisecond the random part is incremented
// instead of redrawn, so ids made by one process sort in creation order.
//
// Request ids end in a tag drawn once per process (4 of the 16 random characters): a statement
// that changes a request tells the process that accepted it by that tag alone (docs/scaling.md,
// "Many processes on one primary"). The other 60 bits stay random.
import { randomBytes, randomFillSync } from 'node:crypto';

export type IdPrefix = 'req' | 'bk' | 'rule' | 'key' | 'usr' | 'ns' | 'ten' | 'ses';

const CROCKFORD = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
const TIME_LEN = 10;
const RANDOM_LEN = 16;
const ULID_LEN = TIME_LEN + RANDOM_LEN;
const MAX_TIME = 2 ** 48 - 1;
const PREFIX_RE = /^[a-z][a-z0-9]{0,15}$/;
const ULID_RE = /^[0-7][0-9A-HJKMNP-TV-Z]{25}$/;

export type IdGenerator = (prefix: IdPrefix | (string & {})) => string;

function encodeTime(ms: number): string {
  let out = '';
  let t = ms;
  for (let i = 0; i < TIME_LEN; i++) {
    out = CROCKFORD[t % 32] + out;
    t = Math.floor(t / 32);
  }
  return out;
}

// The CSPRNG's bytes are drawn a block at a time (as node's own randomUUID does): a draw of ten
// bytes per id cost a call into OpenSSL, and its fork check, per request.
const RANDOM_BYTES = 10;
const randomPool = Buffer.alloc(RANDOM_BYTES * 128);
let randomAt = randomPool.length;

function freshRandomDigits(): number[] {
  if (randomAt === randomPool.length) {
    randomFillSync(randomPool);
    randomAt = 0;
  }
  const from = randomAt;
  randomAt += RANDOM_BYTES;
  const digits: number[] = [];
  // 80 bits split into sixteen 5-bit digits, most significant first.
  let acc = 0;
  let bits = 0;
  for (let i = from; i < from + RANDOM_BYTES; i++) {
    const b = randomPool[i]!;
    acc = (acc << 8) | b;
    bits += 8;
    while (bits >= 5) {
      bits -= 5;
      digits.push((acc >> bits) & 31);
    }
    acc &= (1 << bits) - 1;
  }
  return digits;
}

// Returns false when the 80-bit counter wrapped (2^80 ids in one millisecond: never in practice).
function incrementDigits(digits: number[]): boolean {
  for (let i = digits.length - 1; i >= 0; i--) {
    if (digits[i] < 31) {
      digits[i]++;
      return true;
    }
    digits[i] = 0;
  }
  return false;
}

/** Characters of a request id's random part that name the process that made it. */
export const TAG_LEN = 4;

/**
 * A generator with its own monotonic state. `now` is injectable for tests. A clock that steps
 * backwards keeps using the last timestamp, so order survives it. With `tag` (TAG_LEN Crockford
 * characters), every id ends in it and the random digits before it count within a millisecond.
 */
export function createIdGenerator(now: () => number = Date.now, tag = ''): IdGenerator {
  if (tag !== '' && !new RegExp(`^[${CROCKFORD}]{${TAG_LEN}}$`).test(tag)) throw new TypeError(`invalid id tag: ${JSON.stringify(tag)}`);
  let lastTime = -1;
  let lastDigits: number[] = [];
  const digits = () => freshRandomDigits().slice(0, RANDOM_LEN - tag.length);
  return (prefix) => {
    if (!PREFIX_RE.test(prefix)) throw new TypeError(`invalid id prefix: ${JSON.stringify(prefix)}`);
    let time = Math.floor(now());
    if (!Number.isSafeInteger(time) || time < 0 || time > MAX_TIME) throw new RangeError('clock out of ULID range');
    if (time <= lastTime) {
      time = lastTime;
      if (!incrementDigits(lastDigits)) {
        time = lastTime + 1;
        lastDigits = digits();
      }
    } else {
      lastDigits = digits();
    }
    lastTime = time;
    return `${prefix}_${encodeTime(time)}${lastDigits.map((d) => CROCKFORD[d]).join('')}${tag}`;
  };
}

/** This process's tag: every request id it makes ends in it. */
export const PROCESS_TAG = randomChars(CROCKFORD, TAG_LEN);

const defaultGenerator = createIdGenerator();
const requestIds = createIdGenerator(Date.now, PROCESS_TAG);

/** A new id such as `req_01J9Z3...`; ids from this process sort in creation order. */
export function newId(prefix: IdPrefix | (string & {})): string {
  return prefix === 'req' ? requestIds(prefix) : defaultGenerator(prefix);
}

/** The tag of the process that made request id `id` (its last characters). */
export function requestTag(id: string): string {
  return id.slice(-TAG_LEN);
}

function ulidPart(id: string): string | null {
  const sep = id.lastIndexOf('_');
  const prefix = id.slice(0, sep);
  const ulid = id.slice(sep + 1);
  if (sep < 0 || !PREFIX_RE.test(prefix) || ulid.length !== ULID_LEN || !ULID_RE.test(ulid)) return null;
  return ulid;
}

/** True when `id` is a well-formed id, with the given prefix when one is named. */
export function isId(id: unknown, prefix?: IdPrefix | (string & {})): id is string {
  if (typeof id !== 'string' || id.length > 64) return false;
  if (ulidPart(id) === null) return false;
  return prefix === undefined || id.startsWith(`${prefix}_`);
}

/** Creation time of an id in epoch milliseconds. Throws on a malformed id. */
export function idTime(id: string): number {
  const ulid = ulidPart(id);
  if (ulid === null) throw new TypeError(`not a Sarsen id: ${JSON.stringify(id.slice(0, 80))}`);
  let ms = 0;
  for (let i = 0; i < TIME_LEN; i++) ms = ms * 32 + CROCKFORD.indexOf(ulid[i]);
  return ms;
}

/**
 * The smallest id with the given prefix made at `ms` (clamped to the ULID range): every id
 * made at `ms` or later sorts at or above it, every one made earlier below it.
 */
export function firstIdAt(prefix: IdPrefix, ms: number): string {
  const t = Math.min(MAX_TIME, Math.max(0, Math.floor(ms)));
  return `${prefix}_${encodeTime(t)}${'0'.repeat(RANDOM_LEN)}`;
}

/**
 * `length` characters drawn uniformly from `alphabet` with the CSPRNG. Bytes at or above
 * the largest multiple of the alphabet size are rejected, so no character is favoured.
 */
export function randomChars(alphabet: string, length: number): string {
  const n = alphabet.length;
  if (n < 2 || n > 256) throw new RangeError('alphabet must have 2..256 characters');
  const limit = 256 - (256 % n);
  let out = '';
  while (out.length < length) {
    for (const b of randomBytes(Math.max(16, (length - out.length) * 2))) {
      if (b < limit) out += alphabet[b % n];
      if (out.length === length) break;
    }
  }
  return out;
}
