// Sealing of provider credentials at rest: AES-256-GCM under keys derived from the
// `credential-key` secret file(s). Layout of a sealed value:
//   [1 byte key version][12 byte random nonce][ciphertext][16 byte GCM tag]
// The version byte lets the secret rotate: old rows still open under their version
// while new seals use the current one.
import { createCipheriv, createDecipheriv, createSecretKey, hkdfSync, randomBytes, type KeyObject } from 'node:crypto';

const ALGORITHM = 'aes-256-gcm';
const NONCE_LEN = 12;
const TAG_LEN = 16;
const HEADER_LEN = 1 + NONCE_LEN;
// Fixed domain-separation constants: changing either makes every sealed value unreadable.
const HKDF_SALT = Buffer.from('sarsen/credential-sealing/v1', 'utf8');
const HKDF_INFO = Buffer.from('sarsen aes-256-gcm key for provider credentials', 'utf8');

export type Keyring = {
  readonly currentVersion: number;
  readonly versions: readonly number[];
  /** Derived 32-byte key for a version, or undefined. */
  readonly keyFor: (version: number) => KeyObject | undefined;
};

export type KeyringSecret = { version: number; secret: string | Buffer };

function sealError(message: string): Error {
  return Object.assign(new Error(message), { code: 'SARSEN_UNSEAL_FAILED' });
}

/**
 * Builds a keyring from secret contents. The secret is used byte for byte (strings as
 * UTF-8): trimming a trailing newline from a file is the reader's job, and must be
 * done consistently or old values stop opening. `currentVersion` defaults to the highest.
 */
export function createKeyring(secrets: readonly KeyringSecret[], currentVersion?: number): Keyring {
  if (secrets.length === 0) throw new Error('keyring needs at least one secret');
  // Key objects, made once: Node would otherwise make one from a Buffer on every cipher.
  const keys = new Map<number, KeyObject>();
  for (const { version, secret } of secrets) {
    if (!Number.isInteger(version) || version < 1 || version > 255) {
      throw new RangeError(`key version must be an integer 1..255, got ${version}`);
    }
    if (keys.has(version)) throw new Error(`key version ${version} given twice`);
    const ikm = typeof secret === 'string' ? Buffer.from(secret, 'utf8') : secret;
    if (ikm.length === 0) throw new Error(`secret for key version ${version} is empty`);
    keys.set(version, createSecretKey(Buffer.from(hkdfSync('sha256', ikm, HKDF_SALT, HKDF_INFO, 32))));
  }
  const versions = [...keys.keys()].sort((a, b) => a - b);
  const current = currentVersion ?? versions[versions.length - 1];
  if (!keys.has(current)) throw new Error(`current key version ${current} has no secret`);
  return Object.freeze({
    currentVersion: current,
    versions: Object.freeze(versions),
    keyFor: (version: number) => keys.get(version),
  });
}

// The header is authenticated along with the caller's AAD, so neither can be swapped.
function associatedData(header: Buffer, aad: string | undefined): Buffer {
  return Buffer.concat([header, Buffer.from(aad ?? '', 'utf8')]);
}

/**
 * Encrypts `plaintext` under the current key. Pass `aad` (for example the backend id)
 * to bind the sealed value to its row: it then opens only with the same `aad`.
 */
export function seal(keyring: Keyring, plaintext: string, aad?: string): Buffer {
  const version = keyring.currentVersion;
  const key = keyring.keyFor(version);
  if (key === undefined) throw new Error(`no key for version ${version}`);
  const nonce = randomBytes(NONCE_LEN);
  const header = Buffer.concat([Buffer.from([version]), nonce]);
  const cipher = createCipheriv(ALGORITHM, key, nonce, { authTagLength: TAG_LEN });
  cipher.setAAD(associatedData(header, aad));
  const body = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()]);
  return Buffer.concat([header, body, cipher.getAuthTag()]);
}

/** Key version a sealed value was made under (for finding rows to re-seal after rotation). */
export function sealedKeyVersion(sealed: Buffer): number {
  if (sealed.length < HEADER_LEN + TAG_LEN) throw sealError('sealed value is truncated');
  return sealed[0];
}

/**
 * Decrypts a sealed value. Throws (code `SARSEN_UNSEAL_FAILED`) on an unknown key
 * version, a wrong `aad`, truncation or any tampering. Messages never carry key material.
 */
export function open(keyring: Keyring, sealed: Buffer, aad?: string): string {
  const version = sealedKeyVersion(sealed);
  const key = keyring.keyFor(version);
  if (key === undefined) throw sealError(`sealed under unknown key version ${version}`);
  const header = sealed.subarray(0, HEADER_LEN);
  const nonce = sealed.subarray(1, HEADER_LEN);
  const body = sealed.subarray(HEADER_LEN, sealed.length - TAG_LEN);
  const tag = sealed.subarray(sealed.length - TAG_LEN);
  const decipher = createDecipheriv(ALGORITHM, key, nonce, { authTagLength: TAG_LEN });
  decipher.setAAD(associatedData(header, aad));
  decipher.setAuthTag(tag);
  try {
    const plain = Buffer.concat([decipher.update(body), decipher.final()]);
    return plain.toString('utf8');
  } catch {
    throw sealError('sealed value failed authentication (tampered, wrong key or wrong binding)');
  }
}
