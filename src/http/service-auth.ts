// Authentication of the service routes `/{tenancy}/{namespace}/v1/...` (docs/api.md
// "Authentication").
//
// Key lookups are cached per process by prefix for KEY_TTL_MS, so the steady state costs no
// database round trip; a lookup also brings the key's rate limits and its namespace's cache
// life. Revocation reaches every process over the bus at once (a trigger NOTIFYs `api-key`
// with the prefix); the TTL bounds it when a notification is missed, so a revoked key stops
// working within KEY_TTL_MS (5 s) at worst. `last_used_at` is written by a coalescing
// flusher: at most one UPDATE per LAST_USED_FLUSH_MS for all keys used.
import { hash, timingSafeEqual } from 'node:crypto';
import type { Request, Response, NextFunction, RequestHandler } from 'express';
import type { Deps } from '../deps.ts';
import { ServiceError } from '../core/errors.ts';
import { parseApiKey, verifyApiKeySecret, looksLikeSarsenKey } from '../core/api-keys.ts';
import { findKeyForAuth, recordKeysUsed, type Grant, type KeyForAuth } from '../db/api-keys.ts';
import type { KeyLimits } from '../db/rate-limits.ts';
import { logger, errorFields } from '../log.ts';

export const KEY_TTL_MS = 5_000;
export const LAST_USED_FLUSH_MS = 30_000;
const MAX_CACHED_KEYS = 50_000;

export type ServiceAuth = Readonly<{
  tenancyId: string;
  tenancySlug: string;
  namespaceId: string;
  namespaceName: string;
  apiKeyId: string;
  apiKeyPrefix: string;
  grants: readonly Grant[];
  /** The key's rate limits; null when it has none. */
  limits: KeyLimits | null;
  /** The namespace's response cache life; null when the cache is off. */
  cacheTtlMinutes: number | null;
}>;

/** The caller's identity on a route behind serviceAuth. */
export function serviceAuthOf(res: Response): ServiceAuth {
  const auth = (res.locals as { auth?: ServiceAuth }).auth;
  if (!auth) throw new Error('serviceAuth did not run for this route');
  return auth;
}

type Authenticator = {
  lookup(prefix: string): Promise<KeyForAuth | null>;
  touch(apiKeyId: string): void;
  close(): Promise<void>;
};

const authenticators = new WeakMap<Deps, Authenticator>();

function createAuthenticator(deps: Deps): Authenticator {
  const cache = new Map<string, { at: number; key: Promise<KeyForAuth | null> }>();
  const forget = (prefix: unknown) => {
    if (typeof prefix === 'string') cache.delete(prefix);
    else cache.clear();
  };
  const unsubscribe = deps.bus.subscribe('api-key', (msg) => forget(msg.prefix));
  const unReconnect = deps.bus.onReconnect(() => cache.clear());

  let used = new Map<string, number>();
  let timer: NodeJS.Timeout | null = null;
  let flushing: Promise<void> = Promise.resolve();
  const flush = (): Promise<void> => {
    if (timer) clearTimeout(timer);
    timer = null;
    const batch = used;
    used = new Map();
    if (batch.size === 0) return flushing;
    const times = new Map([...batch].map(([id, ms]) => [id, new Date(ms)]));
    flushing = flushing
      .then(() => recordKeysUsed(deps.pool, times))
      .catch((err) => {
        logger.warn('recording API key use failed; will retry', errorFields(err));
        for (const [id, ms] of batch) if ((used.get(id) ?? 0) < ms) used.set(id, ms);
      });
    return flushing;
  };

  return {
    lookup(prefix) {
      const now = Date.now();
      const hit = cache.get(prefix);
      if (hit && now - hit.at < KEY_TTL_MS) return hit.key;
      const key = findKeyForAuth(deps.pool, prefix);
      cache.delete(prefix); // re-inserted last: the Map's order is the eviction order
      cache.set(prefix, { at: now, key });
      key.catch(() => {
        if (cache.get(prefix)?.key === key) cache.delete(prefix);
      });
      if (cache.size > MAX_CACHED_KEYS) cache.delete(cache.keys().next().value!);
      return key;
    },
    touch(apiKeyId) {
      used.set(apiKeyId, Date.now());
      if (!timer) {
        timer = setTimeout(() => void flush(), LAST_USED_FLUSH_MS);
        timer.unref();
      }
    },
    async close() {
      unsubscribe();
      unReconnect();
      cache.clear();
      await flush();
    },
  };
}

function authenticatorFor(deps: Deps): Authenticator {
  let authenticator = authenticators.get(deps);
  if (!authenticator) authenticators.set(deps, (authenticator = createAuthenticator(deps)));
  return authenticator;
}

/** Writes pending last-used times and releases the cache (at shutdown). */
export async function closeServiceAuth(deps: Deps): Promise<void> {
  const authenticator = authenticators.get(deps);
  authenticators.delete(deps);
  await authenticator?.close();
}

function header(req: Request, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v.join(', ') : v;
}

function bearerToken(authorization: string | undefined): string | undefined {
  const m = /^\s*bearer\s+(\S+)\s*$/i.exec(authorization ?? '');
  return m?.[1];
}

// Headers a provider reads or Sarsen forwards to it: a Sarsen key in any of them would leak.
function forwardsSarsenKey(req: Request, sarsenHeaderSent: boolean): boolean {
  if (looksLikeSarsenKey(header(req, 'x-api-key'))) return true;
  if (sarsenHeaderSent && looksLikeSarsenKey(header(req, 'authorization'))) return true;
  for (const name of Object.keys(req.headers)) {
    if ((name.startsWith('anthropic-') || name.startsWith('openai-')) && looksLikeSarsenKey(header(req, name))) return true;
  }
  return false;
}

/**
 * What a looked-up key row (an answer of the cache above, replaced within KEY_TTL_MS and at once
 * when the key changes) already granted: the SHA-256 of the secret last verified against its
 * HMAC, and the identity that verification gave. The same secret presented again is compared
 * (in constant time) with that digest instead of computing the HMAC again; any other secret is
 * verified in full. The secret itself is never kept.
 */
type Verified = { secretDigest: Buffer; auth: ServiceAuth };
const verifiedKeys = new WeakMap<KeyForAuth, Verified>();

const secretDigest = (secret: string): Buffer => hash('sha256', secret, 'buffer');

function identityOf(key: KeyForAuth): ServiceAuth {
  return Object.freeze({
    tenancyId: key.tenancy_id,
    tenancySlug: key.tenancy_slug,
    namespaceId: key.namespace_id,
    namespaceName: key.namespace_name,
    apiKeyId: key.api_key_id,
    apiKeyPrefix: key.prefix,
    grants: Object.freeze([...key.grants]),
    limits:
      key.requests_per_minute === null && key.tokens_per_minute === null
        ? null
        : Object.freeze({ requestsPerMinute: key.requests_per_minute, tokensPerMinute: key.tokens_per_minute }),
    cacheTtlMinutes: key.cache_ttl_minutes,
  });
}

/** The identity `secret` proves for `key`, or null when it does not match the key's stored hash. */
function verifiedIdentity(deps: Deps, key: KeyForAuth, prefix: string, secret: string): ServiceAuth | null {
  const digest = secretDigest(secret);
  const known = verifiedKeys.get(key);
  if (known && timingSafeEqual(known.secretDigest, digest)) return known.auth;
  if (!verifyApiKeySecret(deps.secrets.apiKeyHashKey, prefix, secret, key.secret_hash)) return null;
  const auth = identityOf(key);
  verifiedKeys.set(key, { secretDigest: digest, auth });
  return auth;
}

// One error for every kind of bad key, so an answer never tells which kind it was.
const unauthorised = () => new ServiceError('unauthorised');

async function authenticate(deps: Deps, authenticator: Authenticator, req: Request, grant: Grant): Promise<ServiceAuth> {
  const sarsenHeader = header(req, 'x-sarsen-key');
  if (forwardsSarsenKey(req, sarsenHeader !== undefined)) throw new ServiceError('sarsen_key_forwarded');
  let presented: string | undefined;
  if (sarsenHeader !== undefined) {
    presented = sarsenHeader.trim();
  } else {
    presented = bearerToken(header(req, 'authorization'));
    if (presented?.startsWith('sk-ant-')) throw new ServiceError('provider_credential');
  }
  const parsed = presented === undefined ? null : parseApiKey(presented);
  if (parsed === null) throw unauthorised();
  const key = await authenticator.lookup(parsed.prefix);
  const auth = key === null || key.revoked ? null : verifiedIdentity(deps, key, parsed.prefix, parsed.secret);
  if (key === null || auth === null || key.tenancy_slug !== req.params.tenancy || key.namespace_name !== req.params.namespace) {
    throw unauthorised();
  }
  if (!key.grants.includes(grant)) {
    throw new ServiceError('forbidden', `The key has no "${grant}" grant on this namespace.`);
  }
  authenticator.touch(key.api_key_id);
  return auth;
}

/**
 * Middleware for one service route (mount it per route, not router-wide, so unknown paths
 * still answer 404). Reads `:tenancy` and `:namespace` from the route's params and sets
 * `res.locals.auth` (see serviceAuthOf) when the key is valid for them and holds `grant`.
 */
export function serviceAuth(deps: Deps, grant: Grant): RequestHandler {
  const authenticator = authenticatorFor(deps);
  return (req: Request, res: Response, next: NextFunction) => {
    authenticate(deps, authenticator, req, grant).then((auth) => {
      res.locals.auth = auth;
      next();
    }, next);
  };
}
