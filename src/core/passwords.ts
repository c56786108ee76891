// Console passwords: scrypt from node:crypto with a per-user random salt, encoded as
// `scrypt$N$r$p$saltB64$hashB64` so parameters can be raised later without a migration
// (old hashes keep verifying under the parameters they carry).
//
// N=16384, r=8, p=1 (its cost: docs/measurements.md "Costs measured in isolation"): slow
// enough to make offline guessing expensive, fast enough that a burst of sign-ins does not
// stall the event loop's thread pool.
import { randomBytes, scrypt, timingSafeEqual } from 'node:crypto';
import type { ScryptOptions } from 'node:crypto';
import { randomChars } from './ids.ts';

export const SCRYPT_N = 16384;
export const SCRYPT_R = 8;
export const SCRYPT_P = 1;
const SALT_LEN = 16;
const HASH_LEN = 32;
// Bounds on what a stored string may ask for, so a corrupt row cannot demand huge work:
// at most 64 MiB (scrypt uses 128*N*r bytes) and 16 times today's CPU cost.
const MAX_NR = 2 ** 19;
const MAX_NRP = 2 ** 21;
// Letters and digits that cannot be mistaken for one another when read aloud or copied.
const UNAMBIGUOUS = '23456789abcdefghjkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ';
const GENERATED_LENGTH = 24;

type Params = { N: number; r: number; p: number };

function derive(password: string, salt: Buffer, params: Params, keylen: number): Promise<Buffer> {
  const options: ScryptOptions = { ...params, maxmem: 128 * params.N * params.r + 1024 * 1024 };
  // NFC so the same password typed on different systems hashes the same.
  const pw = Buffer.from(password.normalize('NFC'), 'utf8');
  return new Promise((resolve, reject) => {
    scrypt(pw, salt, keylen, options, (err, key) => (err ? reject(err) : resolve(key)));
  });
}

/** Hashes a password with a fresh salt; the result is self-describing. */
export async function hashPassword(password: string): Promise<string> {
  const salt = randomBytes(SALT_LEN);
  const params = { N: SCRYPT_N, r: SCRYPT_R, p: SCRYPT_P };
  const hash = await derive(password, salt, params, HASH_LEN);
  return ['scrypt', SCRYPT_N, SCRYPT_R, SCRYPT_P, salt.toString('base64'), hash.toString('base64')].join('$');
}

type Decoded = Params & { salt: Buffer; hash: Buffer };

const INT_RE = /^[1-9][0-9]{0,7}$/;
const B64_RE = /^[A-Za-z0-9+/]+={0,2}$/;

function decode(encoded: string): Decoded | null {
  if (typeof encoded !== 'string' || encoded.length > 512) return null;
  const parts = encoded.split('$');
  if (parts.length !== 6 || parts[0] !== 'scrypt') return null;
  const [, n, r, p, saltB64, hashB64] = parts;
  if (!INT_RE.test(n) || !INT_RE.test(r) || !INT_RE.test(p)) return null;
  if (!B64_RE.test(saltB64) || !B64_RE.test(hashB64)) return null;
  const params = { N: Number(n), r: Number(r), p: Number(p) };
  const powerOfTwo = (params.N & (params.N - 1)) === 0;
  if (params.N < 2 || !powerOfTwo) return null;
  if (params.N * params.r > MAX_NR || params.N * params.r * params.p > MAX_NRP) return null;
  const salt = Buffer.from(saltB64, 'base64');
  const hash = Buffer.from(hashB64, 'base64');
  if (salt.length < 8 || hash.length < 16 || hash.length > 64) return null;
  return { ...params, salt, hash };
}

/** True when `password` matches `encoded`. A malformed `encoded` is false, never a throw. */
export async function verifyPassword(password: string, encoded: string): Promise<boolean> {
  const decoded = decode(encoded);
  if (decoded === null || typeof password !== 'string') return false;
  try {
    const actual = await derive(password, decoded.salt, decoded, decoded.hash.length);
    return timingSafeEqual(actual, decoded.hash);
  } catch {
    return false;
  }
}

const DUMMY_SALT = Buffer.alloc(SALT_LEN, 0x5a);
const DUMMY_HASH = Buffer.alloc(HASH_LEN, 0);

/**
 * Does the work of a real verification and answers false: used for an unknown email so
 * a rejected sign-in takes as long whether or not the account exists.
 */
export async function verifyAgainstDummy(password: string): Promise<false> {
  try {
    const actual = await derive(String(password), DUMMY_SALT, { N: SCRYPT_N, r: SCRYPT_R, p: SCRYPT_P }, HASH_LEN);
    timingSafeEqual(actual, DUMMY_HASH);
  } catch {
    // The answer is false regardless.
  }
  return false;
}

/** A generated (unchosen) password: 24 characters, about 139 bits, easy to copy by eye. */
export function generatePassword(): string {
  return randomChars(UNAMBIGUOUS, GENERATED_LENGTH);
}
