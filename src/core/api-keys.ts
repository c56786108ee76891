// Sarsen API keys: `sar_<prefix>_<secret>` (docs/api.md "Authentication"; docs/administration.md
// "API keys"). The prefix is the public half that listings and logs show; only an HMAC of the
// secret is stored. Neither half uses `_`, so a key splits unambiguously on it.
import { createHmac, createSecretKey, timingSafeEqual, type KeyObject } from 'node:crypto';
import { randomChars } from './ids.ts';

const ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
export const API_KEY_PREFIX_LENGTH = 8;
// 43 characters of a 62-letter alphabet carry about 256 bits.
export const API_KEY_SECRET_LENGTH = 43;
// Parsing accepts a range so the generated length can grow without orphaning old keys.
const SECRET_MIN = 32;
const SECRET_MAX = 128;
const MAX_KEY_LENGTH = 200;
const KEY_RE = new RegExp(`^sar_([A-Za-z0-9]{${API_KEY_PREFIX_LENGTH}})_([A-Za-z0-9]{${SECRET_MIN},${SECRET_MAX}})$`);
const HMAC_DOMAIN = 'sarsen-api-key-v1';

export type GeneratedApiKey = { key: string; prefix: string; secret: string };
export type ParsedApiKey = { prefix: string; secret: string };

/** A fresh key from the CSPRNG. Show `key` once; store `prefix` and the secret's hash. */
export function generateApiKey(): GeneratedApiKey {
  const prefix = randomChars(ALPHABET, API_KEY_PREFIX_LENGTH);
  const secret = randomChars(ALPHABET, API_KEY_SECRET_LENGTH);
  return { key: `sar_${prefix}_${secret}`, prefix, secret };
}

/** Splits a key into its halves; anything not exactly of the key's shape is null. */
export function parseApiKey(s: string): ParsedApiKey | null {
  if (typeof s !== 'string' || s.length > MAX_KEY_LENGTH) return null;
  const m = KEY_RE.exec(s);
  return m === null ? null : { prefix: m[1], secret: m[2] };
}

// Node turns a Buffer key into a key object on every HMAC (docs/measurements.md "Costs
// measured in isolation"); the deployment's key is one Buffer for the life of the process, so
// it is done once.
const keyObjects = new WeakMap<Buffer, KeyObject>();

/** The HMAC key object of `api-key-hash-key` (also keys the caller-credential identity). */
export function hashKeyObject(hashKey: Buffer | string): KeyObject {
  const k = typeof hashKey === 'string' ? Buffer.from(hashKey, 'utf8') : hashKey;
  if (k.length === 0) throw new Error('api key hash key is empty');
  let object = keyObjects.get(k);
  if (!object) keyObjects.set(k, (object = createSecretKey(k)));
  return object;
}

/**
 * A caller-credential's part in the idempotency identity: a keyed hash, so one body under two
 * credentials is two executions and the stored identity reveals nothing of the credential.
 */
export function credentialIdentity(hashKey: Buffer, credential: string): string {
  return createHmac('sha256', hashKeyObject(hashKey)).update(`sarsen-caller-credential\0${credential}`).digest('hex');
}

/**
 * HMAC-SHA256 of the secret under the deployment's `api-key-hash-key`, with the prefix
 * bound in so a stored hash cannot be moved to another key row.
 */
export function hashApiKeySecret(hashKey: Buffer | string, prefix: string, secret: string): Buffer {
  return createHmac('sha256', hashKeyObject(hashKey))
    .update(`${HMAC_DOMAIN}\0${prefix}\0${secret}`, 'utf8')
    .digest();
}

/** Constant-time comparison of a presented secret against the stored hash. */
export function verifyApiKeySecret(
  hashKey: Buffer | string,
  prefix: string,
  secret: string,
  storedHash: Buffer,
): boolean {
  const actual = hashApiKeySecret(hashKey, prefix, secret);
  if (!Buffer.isBuffer(storedHash) || storedHash.length !== actual.length) return false;
  return timingSafeEqual(actual, storedHash);
}

// An optional `Bearer` scheme (any case), then `sar_`. Deliberately looser than
// parseApiKey: a truncated or mangled Sarsen key must not reach a provider either.
const CARRIES_KEY_RE = /^\s*(?:bearer\s+)?sar_/i;

/**
 * Cheap test that a header value carries a Sarsen key, bare or as `Bearer sar_...`.
 * Used to refuse a key sent in a header the provider would read.
 */
export function looksLikeSarsenKey(s: string | undefined | null): boolean {
  return typeof s === 'string' && CARRIES_KEY_RE.test(s.slice(0, 64));
}
