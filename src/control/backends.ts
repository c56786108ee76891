// Backend facts shared by administration, routing and the executor: what each kind speaks,
// which addresses are well-formed, and how a stored credential is opened for a call.
import { open, type Keyring } from '../core/sealing.ts';
import type { BackendKind, Dialect, CredentialSource } from '../db/backends.ts';

export const BACKEND_KINDS = ['chat_compat', 'messages', 'aggregator'] as const satisfies readonly BackendKind[];

/** docs/api.md "Dialects": chat_compat and aggregator speak chat; messages speaks messages. */
export function dialectOfKind(kind: BackendKind): Dialect {
  return kind === 'messages' ? 'messages' : 'chat';
}

export type AddressVerdict = { ok: true; address: string; hostname: string } | { ok: false; reason: string };

/**
 * An absolute http(s) URL with no credentials, query or fragment, stored without a trailing
 * slash so `{address}/chat/completions` and `{address}/v1/messages` join cleanly.
 */
export function normaliseBackendAddress(input: string): AddressVerdict {
  // The URL parser would quietly strip them at either end; a caller sending one has a bug.
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(input)) return { ok: false, reason: 'must not contain control characters' };
  let url: URL;
  try {
    url = new URL(input);
  } catch {
    return { ok: false, reason: 'must be an absolute http or https URL' };
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return { ok: false, reason: 'must use http or https' };
  if (url.username !== '' || url.password !== '') {
    return { ok: false, reason: 'must not carry credentials; send the provider key as `credential`' };
  }
  // `url.search` and `url.hash` are empty for a bare `?` or `#`, so look at the text too.
  if (url.search !== '' || input.includes('?')) return { ok: false, reason: 'must not carry a query string' };
  if (url.hash !== '' || input.includes('#')) return { ok: false, reason: 'must not carry a fragment' };
  if (url.hostname === '') return { ok: false, reason: 'must name a host' };
  const path = url.pathname.replace(/\/+$/, '');
  return { ok: true, address: `${url.protocol}//${url.host}${path}`, hostname: url.hostname };
}

export type SealedCredential = {
  backend_id: string;
  credential_source: CredentialSource;
  credential_sealed: Buffer | null;
};

/**
 * The backend's own provider credential, or null when it holds none (a caller-credential
 * backend, or a backend that needs no key). The sealed value is bound to the backend id,
 * so a value copied onto another row does not open. Throws (SARSEN_UNSEAL_FAILED) when the
 * value does not authenticate; the error never carries key material.
 */
export function openBackendCredential(keyring: Keyring, row: SealedCredential): string | null {
  if (row.credential_source === 'caller' || row.credential_sealed === null) return null;
  const known = opened.get(row.credential_sealed);
  if (known?.keyring === keyring && known.aad === row.backend_id) return known.plain;
  const plain = open(keyring, row.credential_sealed, row.backend_id);
  opened.set(row.credential_sealed, { keyring, aad: row.backend_id, plain });
  return plain;
}

// Opened credentials by the sealed value they came from: the routing cache hands every call
// to a backend the same row, so its credential is decrypted once per load of the row, not once
// per call (docs/decisions.md "Opened backend credentials are kept beside their sealed row").
// Held only while that row is: a reload brings a new value.
const opened = new WeakMap<Buffer, { keyring: Keyring; aad: string; plain: string }>();
