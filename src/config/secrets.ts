// Secrets are files in a mounted directory, one file per secret (docs/operations.md "Secrets").
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import { ConfigError } from './config.ts';

export type Secrets = Readonly<{
  credentialKey: Buffer;
  apiKeyHashKey: Buffer;
  databasePassword: string;
  /** Optional: when the file `metrics-token` exists, GET /metrics needs it as a bearer token. */
  metricsToken?: string;
}>;

export const SECRET_FILES = ['credential-key', 'api-key-hash-key', 'database-password'] as const;

// Key material shorter than this is refused: 32 bytes is the AES-256 / HMAC-SHA256 key size.
export const MIN_KEY_BYTES = 32;
const MIN_PASSWORD_BYTES = 12;

function readSecret(dir: string, name: string, minBytes: number): Buffer {
  const file = path.join(dir, name);
  let raw: Buffer;
  try {
    raw = fs.readFileSync(file);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new ConfigError(`Secret file ${file} is missing or unreadable (${code ?? 'error'}).`);
  }
  // A trailing newline from `echo` or an editor is not part of the secret.
  const value = Buffer.from(raw.toString('utf8').replace(/\r?\n$/, ''), 'utf8');
  if (value.length < minBytes) {
    throw new ConfigError(`Secret file ${file} is too short: it needs at least ${minBytes} bytes.`);
  }
  return value;
}

export function readSecrets(dir: string): Secrets {
  const metricsToken = fs.existsSync(path.join(dir, 'metrics-token')) ? readSecret(dir, 'metrics-token', MIN_PASSWORD_BYTES).toString('utf8') : undefined;
  return Object.freeze({
    credentialKey: readSecret(dir, 'credential-key', MIN_KEY_BYTES),
    apiKeyHashKey: readSecret(dir, 'api-key-hash-key', MIN_KEY_BYTES),
    databasePassword: readSecret(dir, 'database-password', MIN_PASSWORD_BYTES).toString('utf8'),
    ...(metricsToken === undefined ? {} : { metricsToken }),
  });
}

/** Embedded mode only: create any missing secret with fresh random content, readable by the owner alone. */
export function ensureDevSecrets(dir: string): void {
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  for (const name of SECRET_FILES) {
    const file = path.join(dir, name);
    if (fs.existsSync(file)) continue;
    fs.writeFileSync(file, crypto.randomBytes(32).toString('base64url') + '\n', { mode: 0o600, flag: 'wx' });
  }
}
