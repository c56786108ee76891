// /{tenancy}/v1/namespaces/{ns}/routing-rules (viewers read, admins write). A rule routes
// (to a backend of the same namespace, optionally rewriting the model) or declines.
import { z } from 'zod';
import type { Router } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { newId } from '../../core/ids.ts';
import { withTransaction, type PoolClient } from '../../db/pool.ts';
import { lockBackend } from '../../db/backends.ts';
import { insertRule, findRule, listRules, updateRule, deleteRule, type RuleRow, type RuleFields } from '../../db/routing-rules.ts';
import { isForeignKeyViolation } from '../../db/pg-errors.ts';
import { routingChanged } from '../../control/resolve-model.ts';
import { fallbackMismatch } from '../../control/fallback-chains.ts';
import { consoleAuth } from './console-auth.ts';
import { namespaceParam, namespaceOf } from './namespaces.ts';
import { readPayload, text, reference, isoTime } from './validate.ts';

const PRIORITY_LIMIT = 1_000_000;
const priority = z.number().int('must be an integer').min(-PRIORITY_LIMIT).max(PRIORITY_LIMIT);
const action = z.enum(['route', 'decline']);
const model = text(256);

const fallbacks = z.array(reference).max(8, 'at most 8 fallback backends');

export const createSchema = z.strictObject({
  model,
  backend_id: reference.nullable().optional(),
  fallback_backend_ids: fallbacks.optional(),
  rewrite_model: model.nullable().optional(),
  priority: priority.optional(),
  action: action.optional(),
});

export const patchSchema = z.strictObject({
  model: model.optional(),
  backend_id: reference.nullable().optional(),
  fallback_backend_ids: fallbacks.optional(),
  rewrite_model: model.nullable().optional(),
  priority: priority.optional(),
  action: action.optional(),
});

export function ruleView(rule: RuleRow) {
  return {
    rule_id: rule.id,
    model: rule.model,
    backend_id: rule.backend_id,
    fallback_backend_ids: rule.fallback_backend_ids,
    rewrite_model: rule.rewrite_model,
    priority: rule.priority,
    action: rule.action,
    created_at: isoTime(rule.created_at),
  };
}

/**
 * The rule's shape rules: a route names a backend of this namespace and fallbacks that fit it
 * (src/control/fallback-chains.ts); a decline names none. The backends are share-locked, so an
 * edit or deletion of one waits for this rule and then checks against it.
 */
async function checkedRule(tx: PoolClient, namespaceId: string, rule: RuleFields): Promise<RuleFields> {
  if (rule.action === 'decline') {
    if (rule.backend_id !== null) throw new ServiceError('bad_request', 'backend_id: a declining rule routes nowhere; leave it out');
    if (rule.fallback_backend_ids?.length) throw new ServiceError('bad_request', 'fallback_backend_ids: a declining rule routes nowhere; leave it out');
    if (rule.rewrite_model !== null) throw new ServiceError('bad_request', 'rewrite_model: a declining rule rewrites nothing; leave it out');
    return rule;
  }
  if (rule.backend_id === null) throw new ServiceError('bad_request', 'backend_id: required when action is "route"');
  const primary = await lockBackend(tx, namespaceId, rule.backend_id, 'share');
  if (primary === null) throw new ServiceError('not_found', `No backend ${JSON.stringify(rule.backend_id)} in this namespace.`);
  const seen = new Set([rule.backend_id]);
  for (const id of rule.fallback_backend_ids ?? []) {
    if (seen.has(id)) throw new ServiceError('bad_request', `fallback_backend_ids: ${JSON.stringify(id)} is named twice (or is the rule's backend)`);
    seen.add(id);
    const fallback = await lockBackend(tx, namespaceId, id, 'share');
    if (fallback === null) throw new ServiceError('not_found', `No backend ${JSON.stringify(id)} in this namespace.`);
    const why = fallbackMismatch(primary, fallback);
    if (why !== null) throw new ServiceError('unprocessable_entity', `fallback_backend_ids: ${JSON.stringify(id)} ${why}.`);
  }
  return rule;
}

const missing = () => new ServiceError('not_found', 'No such routing rule in this namespace.');

// A backend deleted between the check and the write.
function backendGone(err: unknown): never {
  if (isForeignKeyViolation(err)) throw new ServiceError('not_found', 'The backend this rule names no longer exists.');
  throw err;
}

export function routingRuleRoutes(deps: Deps, router: Router): void {
  const base = '/:tenancy/v1/namespaces/:ns/routing-rules';
  const one = `${base}/:rule_id`;

  router.get(base, consoleAuth(deps, 'viewer'), namespaceParam(deps), async (_req, res) => {
    res.json({ data: (await listRules(deps.pool, namespaceOf(res).id)).map(ruleView) });
  });

  router.post(base, consoleAuth(deps, 'admin'), namespaceParam(deps), async (req, res) => {
    const body = await readPayload(req, createSchema);
    const ns = namespaceOf(res);
    const rule = await withTransaction(deps.pool, async (tx) => {
      const fields = await checkedRule(tx, ns.id, {
        model: body.model,
        backend_id: body.backend_id ?? null,
        fallback_backend_ids: body.fallback_backend_ids ?? [],
        rewrite_model: body.rewrite_model ?? null,
        priority: body.priority ?? 0,
        action: body.action ?? 'route',
      });
      return insertRule(tx, { id: newId('rule'), namespace_id: ns.id, ...fields });
    }).catch(backendGone);
    routingChanged(deps, ns.id);
    res.status(201).json(ruleView(rule));
  });

  router.get(one, consoleAuth(deps, 'viewer'), namespaceParam(deps), async (req, res) => {
    const rule = await findRule(deps.pool, namespaceOf(res).id, String(req.params.rule_id));
    if (rule === null) throw missing();
    res.json(ruleView(rule));
  });

  router.patch(one, consoleAuth(deps, 'admin'), namespaceParam(deps), async (req, res) => {
    const patch = await readPayload(req, patchSchema);
    const ns = namespaceOf(res);
    const id = String(req.params.rule_id);
    const rule = await withTransaction(deps.pool, async (tx) => {
      const cur = await findRule(tx, ns.id, id, true);
      if (cur === null) throw missing();
      const nextAction = patch.action ?? cur.action;
      // Turning a rule into a decline lets go of its backend and rewrite unless told otherwise.
      const declining = patch.action === 'decline';
      const fields = await checkedRule(tx, ns.id, {
        model: patch.model ?? cur.model,
        backend_id: patch.backend_id !== undefined ? patch.backend_id : declining ? null : cur.backend_id,
        fallback_backend_ids: patch.fallback_backend_ids ?? (declining ? [] : cur.fallback_backend_ids),
        rewrite_model: patch.rewrite_model !== undefined ? patch.rewrite_model : declining ? null : cur.rewrite_model,
        priority: patch.priority ?? cur.priority,
        action: nextAction,
      });
      return updateRule(tx, ns.id, id, fields);
    }).catch(backendGone);
    if (rule === null) throw missing();
    routingChanged(deps, ns.id);
    res.json(ruleView(rule));
  });

  router.delete(one, consoleAuth(deps, 'admin'), namespaceParam(deps), async (req, res) => {
    const ns = namespaceOf(res);
    if (!(await deleteRule(deps.pool, ns.id, String(req.params.rule_id)))) throw missing();
    routingChanged(deps, ns.id);
    res.status(204).end();
  });
}
