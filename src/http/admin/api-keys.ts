// /{tenancy}/v1/namespaces/{ns}/api-keys (viewers read, admins write). The whole key is
// answered once, at creation; only an HMAC of its secret is stored. DELETE revokes: the row
// stays, because requests and the ledger still name the key. PATCH changes a live key's rate
// limits, the one thing about a key that is not fixed when it is issued.
import { z } from 'zod';
import type { Router } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { newId } from '../../core/ids.ts';
import { generateApiKey, hashApiKeySecret } from '../../core/api-keys.ts';
import { insertApiKey, findApiKey, listApiKeys, revokeApiKey, setApiKeyLimits, type ApiKeyRow, type Grant, type StoredLimits } from '../../db/api-keys.ts';
import { isUniqueViolation } from '../../db/pg-errors.ts';
import { consoleAuth } from './console-auth.ts';
import { namespaceParam, namespaceOf } from './namespaces.ts';
import { readPayload, text, spendLimit, keyLimits, isoTime } from './validate.ts';

const grants = z
  .array(z.enum(['use', 'manage']))
  .min(1, 'must name at least one grant')
  .max(2)
  .refine((g) => new Set(g).size === g.length, 'must not repeat a grant')
  .refine((g) => g.includes('use'), 'must include "use": the grants are ["use"] or ["use", "manage"]');

export const createSchema = z.strictObject({
  name: text(100),
  grants,
  spend_limit: spendLimit.optional(),
  limits: keyLimits.optional(),
});

export const patchSchema = z.strictObject({ limits: keyLimits });

/** The stored form of a payload's limits: what it leaves out is off. */
export const storedLimits = (limits: z.output<typeof keyLimits> | undefined): StoredLimits => ({
  requests_per_minute: limits?.requests_per_minute ?? null,
  tokens_per_minute: limits?.tokens_per_minute ?? null,
});

// A prefix collision among 62^8 is rare; a few fresh draws settle it.
const PREFIX_ATTEMPTS = 5;

export function keyView(k: ApiKeyRow) {
  return {
    api_key_id: k.id,
    prefix: k.prefix,
    name: k.name,
    grants: k.grants,
    spend_limit: k.spend_limit,
    limits: { requests_per_minute: k.requests_per_minute, tokens_per_minute: k.tokens_per_minute },
    created_at: isoTime(k.created_at),
    last_used_at: isoTime(k.last_used_at),
    revoked_at: isoTime(k.revoked_at),
  };
}

const missing = () => new ServiceError('not_found', 'No such API key in this namespace.');

export function apiKeyRoutes(deps: Deps, router: Router): void {
  const base = '/:tenancy/v1/namespaces/:ns/api-keys';
  const one = `${base}/:api_key_id`;

  router.get(base, consoleAuth(deps, 'viewer'), namespaceParam(deps), async (_req, res) => {
    res.json({ data: (await listApiKeys(deps.pool, namespaceOf(res).id)).map(keyView) });
  });

  router.post(base, consoleAuth(deps, 'admin'), namespaceParam(deps), async (req, res) => {
    const body = await readPayload(req, createSchema);
    const ns = namespaceOf(res);
    const ordered: Grant[] = body.grants.includes('manage') ? ['use', 'manage'] : ['use'];
    for (let attempt = 1; ; attempt++) {
      const generated = generateApiKey();
      try {
        const row = await insertApiKey(deps.pool, {
          id: newId('key'),
          namespace_id: ns.id,
          name: body.name,
          prefix: generated.prefix,
          secret_hash: hashApiKeySecret(deps.secrets.apiKeyHashKey, generated.prefix, generated.secret),
          grants: ordered,
          spend_limit: body.spend_limit ?? null,
          ...storedLimits(body.limits),
        });
        // A lookup of this prefix may have been cached as unknown: forget it.
        deps.bus.publishLocal({ k: 'api-key', prefix: row.prefix });
        res.status(201).json({ ...keyView(row), key: generated.key });
        return;
      } catch (err) {
        if (isUniqueViolation(err, 'api_keys_prefix_key') && attempt < PREFIX_ATTEMPTS) continue;
        if (isUniqueViolation(err, 'api_keys_live_name_idx')) {
          throw new ServiceError('conflict', `A live API key named ${JSON.stringify(body.name)} already exists in this namespace.`);
        }
        throw err;
      }
    }
  });

  router.get(one, consoleAuth(deps, 'viewer'), namespaceParam(deps), async (req, res) => {
    const k = await findApiKey(deps.pool, namespaceOf(res).id, String(req.params.api_key_id));
    if (k === null) throw missing();
    res.json(keyView(k));
  });

  router.patch(one, consoleAuth(deps, 'admin'), namespaceParam(deps), async (req, res) => {
    const body = await readPayload(req, patchSchema);
    const k = await setApiKeyLimits(deps.pool, namespaceOf(res).id, String(req.params.api_key_id), storedLimits(body.limits));
    if (k === null) throw new ServiceError('not_found', 'No such live API key in this namespace.');
    // This process at once; the others hear the trigger's NOTIFY.
    deps.bus.publishLocal({ k: 'api-key', prefix: k.prefix });
    res.json(keyView(k));
  });

  router.delete(one, consoleAuth(deps, 'admin'), namespaceParam(deps), async (req, res) => {
    const k = await revokeApiKey(deps.pool, namespaceOf(res).id, String(req.params.api_key_id));
    if (k === null) throw missing();
    // This process at once; the others hear the trigger's NOTIFY.
    deps.bus.publishLocal({ k: 'api-key', prefix: k.prefix });
    res.status(204).end();
  });
}
