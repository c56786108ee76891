// The namespace's requests for a console session (viewers read, admins cancel): the listing,
// usage and storage, a record and its replay, the cancel (the service routes' own handlers),
// and the stored bodies byte for byte, which only the console shows.
import type { Request, Response, Router } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { consoleAuth } from './console-auth.ts';
import { namespaceParam, namespaceOf } from './namespaces.ts';
import { accountRoutes, type NamespaceScope } from '../service/accounts.ts';
import { readRequest } from '../service/record.ts';
import { cancelHandler } from '../service/cancel.ts';
import { readStoredBody } from '../../db/console.ts';
import { readResponseIds } from '../../db/background.ts';
import { listRules } from '../../db/routing-rules.ts';
import { compileRules } from '../../core/routing.ts';
import { ruleView } from './routing-rules.ts';

export function requestRoutes(deps: Deps, router: Router): void {
  const scope: NamespaceScope = {
    base: '/:tenancy/v1/namespaces/:ns',
    guards: [consoleAuth(deps, 'viewer'), namespaceParam(deps)],
    namespaceId: (res) => namespaceOf(res).id,
  };
  accountRoutes(deps, router, scope);
  const one = `${scope.base}/requests/:id`;
  router.get(one, ...scope.guards, (req: Request, res: Response) => readRequest(deps, req, res, scope.namespaceId(res)));
  router.post(`${one}/cancel`, consoleAuth(deps, 'admin'), namespaceParam(deps), (req: Request, res: Response) =>
    cancelHandler(deps, req, res, scope.namespaceId(res)),
  );

  // A Responses request by Sarsen's id or the provider's resp_ id: the console finds a response
  // a user names, and shows its attempts' provider ids (docs/console.md "Background responses").
  router.get(`${scope.base}/responses/:id`, ...scope.guards, async (req: Request, res: Response) => {
    const found = await readResponseIds(deps.pool, scope.namespaceId(res), String(req.params.id));
    if (found === null) throw new ServiceError('not_found', 'No response with this id in this namespace.');
    res.json(found);
  });

  // "Which rule takes model X?": the router's own precedence over the namespace's rules.
  router.get(`${scope.base}/route`, ...scope.guards, async (req: Request, res: Response) => {
    const model = req.query.model;
    if (typeof model !== 'string' || model === '') throw new ServiceError('bad_request', '`model` must be given once.');
    const rules = await listRules(deps.pool, scope.namespaceId(res));
    const rule = compileRules(rules.map((r) => ({ ...r, rule_id: r.id })))(model);
    res.json({ model, rule: rule ? ruleView(rules.find((r) => r.id === rule.rule_id)!) : null });
  });

  // The canonical body as sent upstream, and the stored answer (success or error body), each
  // exactly as stored. The answer goes out as text/plain (never rendered as markup); its own
  // content type rides in X-Stored-Content-Type.
  for (const which of ['request', 'answer'] as const) {
    router.get(`${one}/${which === 'request' ? 'body' : 'answer'}`, ...scope.guards, async (req: Request, res: Response) => {
      const b = await readStoredBody(deps.pool, scope.namespaceId(res), String(req.params.id), which);
      if (b === null) throw new ServiceError('not_found', 'No such request in this namespace.');
      if (b.expired) throw new ServiceError('record_expired');
      if (b.body === null) throw new ServiceError('not_found', `This request has no stored ${which === 'request' ? 'body' : 'answer (yet, or it was streamed)'}.`);
      if (which === 'request') res.set('content-type', 'application/json');
      else res.set({ 'content-type': 'text/plain; charset=utf-8', 'x-stored-content-type': b.content_type ?? '' });
      res.status(200).set('x-content-type-options', 'nosniff').send(b.body);
    });
  }
}
