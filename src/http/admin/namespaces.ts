// /{tenancy}/v1/namespaces: namespaces of the session's tenancy (viewers read, admins write).
import { z } from 'zod';
import type { Request, Response, NextFunction, RequestHandler, Router } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { newId } from '../../core/ids.ts';
import { isNamespaceName } from '../../core/slugs.ts';
import { effectiveRetentionMinutes } from '../../core/retention.ts';
import {
  insertNamespace,
  findNamespace,
  listNamespaces,
  updateNamespace,
  deleteNamespace,
  type NamespaceRow,
} from '../../db/namespaces.ts';
import { isUniqueViolation, isForeignKeyViolation } from '../../db/pg-errors.ts';
import { routingChanged } from '../../control/resolve-model.ts';
import { consoleAuth, consoleOf } from './console-auth.ts';
import { readPayload, retentionMinutes, spendLimit, cacheTtlMinutes, isoTime } from './validate.ts';

const name = z
  .string()
  .refine(isNamespaceName, 'must be 1-63 lowercase letters, digits or hyphens, starting with a letter or digit, and not "v1"');

export const createSchema = z.strictObject({
  name,
  retention_minutes: retentionMinutes.optional(),
  spend_limit: spendLimit.optional(),
  cache_ttl_minutes: cacheTtlMinutes.optional(),
});

export const patchSchema = z.strictObject({
  retention_minutes: retentionMinutes.optional(),
  spend_limit: spendLimit.optional(),
  cache_ttl_minutes: cacheTtlMinutes.optional(),
});

export function namespaceView(deps: Deps, n: NamespaceRow) {
  return {
    namespace_id: n.id,
    name: n.name,
    retention_minutes: n.retention_minutes,
    effective_retention_minutes: effectiveRetentionMinutes({
      namespaceMinutes: n.retention_minutes,
      tenancyMinutes: n.tenancy_retention_minutes,
      metadataHorizonMinutes: deps.settings.current().metadata_horizon_minutes,
    }),
    spend_limit: n.spend_limit,
    cache_ttl_minutes: n.cache_ttl_minutes,
    created_at: isoTime(n.created_at),
  };
}

export function namespaceOf(res: Response): NamespaceRow {
  const n = (res.locals as { namespace?: NamespaceRow }).namespace;
  if (!n) throw new Error('namespaceParam did not run for this route');
  return n;
}

/** Resolves `:ns` within the session's tenancy; anything else is 404. Runs after consoleAuth. */
export function namespaceParam(deps: Deps): RequestHandler {
  return async (req: Request, res: Response, next: NextFunction) => {
    const ns = await findNamespace(deps.pool, consoleOf(res).user.tenancy_id, String(req.params.ns));
    if (ns === null) throw new ServiceError('not_found', `No namespace ${JSON.stringify(req.params.ns)} in this tenancy.`);
    res.locals.namespace = ns;
    next();
  };
}

export function namespaceRoutes(deps: Deps, router: Router): void {
  const base = '/:tenancy/v1/namespaces';
  router.get(base, consoleAuth(deps, 'viewer'), async (_req, res) => {
    const rows = await listNamespaces(deps.pool, consoleOf(res).user.tenancy_id);
    res.json({ data: rows.map((n) => namespaceView(deps, n)) });
  });

  router.post(base, consoleAuth(deps, 'admin'), async (req, res) => {
    const body = await readPayload(req, createSchema);
    try {
      const n = await insertNamespace(deps.pool, {
        id: newId('ns'),
        tenancy_id: consoleOf(res).user.tenancy_id,
        name: body.name,
        retention_minutes: body.retention_minutes ?? null,
        spend_limit: body.spend_limit ?? null,
        cache_ttl_minutes: body.cache_ttl_minutes ?? null,
      });
      res.status(201).json(namespaceView(deps, n));
    } catch (err) {
      if (isUniqueViolation(err)) throw new ServiceError('conflict', `A namespace named ${JSON.stringify(body.name)} already exists.`);
      throw err;
    }
  });

  const one = `${base}/:ns`;
  router.get(one, consoleAuth(deps, 'viewer'), namespaceParam(deps), (_req, res) => {
    res.json(namespaceView(deps, namespaceOf(res)));
  });

  router.patch(one, consoleAuth(deps, 'admin'), namespaceParam(deps), async (req, res) => {
    const patch = await readPayload(req, patchSchema);
    const n = await updateNamespace(deps.pool, namespaceOf(res).id, patch);
    if (n === null) throw new ServiceError('not_found');
    // Acceptance reads the cache life with the key: this process forgets its keys at once, the
    // others on the trigger's NOTIFY.
    if (patch.cache_ttl_minutes !== undefined) deps.bus.publishLocal({ k: 'api-key' });
    res.json(namespaceView(deps, n));
  });

  router.delete(one, consoleAuth(deps, 'admin'), namespaceParam(deps), async (_req, res) => {
    const ns = namespaceOf(res);
    try {
      if (!(await deleteNamespace(deps.pool, ns.id))) throw new ServiceError('not_found');
    } catch (err) {
      // Records that later parts keep (requests, the ledger) may hold the namespace.
      if (isForeignKeyViolation(err)) throw new ServiceError('conflict', 'Other records still refer to this namespace.');
      throw err;
    }
    routingChanged(deps, ns.id);
    deps.bus.publishLocal({ k: 'api-key' }); // its keys are gone: forget every cached key
    res.status(204).end();
  });
}
