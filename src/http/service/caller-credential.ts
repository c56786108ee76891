// Caller-credential backends (docs/api.md "Authentication", behind --credential-passthrough):
// the provider credential each call brings, and what of it may be kept.
import crypto from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';
import { looksLikeSarsenKey, hashKeyObject } from '../../core/api-keys.ts';

/**
 * The provider credential a call brought: `x-api-key`, else the `Authorization` bearer value
 * (which is then not the Sarsen key: that travels in X-Sarsen-Key). Null when none came.
 */
export function callerCredential(headers: IncomingHttpHeaders): string | null {
  const apiKey = headers['x-api-key'];
  if (typeof apiKey === 'string' && apiKey.trim() !== '') return apiKey.trim();
  const authorization = headers.authorization;
  if (typeof authorization !== 'string') return null;
  const m = /^Bearer\s+(\S+)\s*$/i.exec(authorization);
  if (!m || looksLikeSarsenKey(m[1]!)) return null;
  return m[1]!;
}

/**
 * The credential's part in the idempotency identity: a keyed hash, so one body under two
 * credentials is two executions and the stored identity reveals nothing of the credential.
 */
export function credentialIdentity(hashKey: Buffer, credential: string): string {
  return crypto.createHmac('sha256', hashKeyObject(hashKey)).update(`sarsen-caller-credential\0${credential}`).digest('hex');
}
