// Caller-credential backends (docs/api.md "Authentication", behind --credential-passthrough):
// the provider credential each call brings (what of it may be kept, its keyed hash in the
// idempotency identity: src/core/api-keys.ts credentialIdentity).
import type { IncomingHttpHeaders } from 'node:http';
import { looksLikeSarsenKey } from '../../core/api-keys.ts';

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
