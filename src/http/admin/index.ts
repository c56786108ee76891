// The administration routes under /{tenancy}/v1/... (docs/administration.md "Administration
// routes"). Each route carries its own session check, so unknown paths still fall through to the
// 404 handler.
import express, { type Router } from 'express';
import type { Deps } from '../../deps.ts';
import { sessionRoutes } from './console-auth.ts';
import { tenancyRoutes } from './tenancy.ts';
import { namespaceRoutes } from './namespaces.ts';
import { backendRoutes } from './backends.ts';
import { routingRuleRoutes } from './routing-rules.ts';
import { apiKeyRoutes } from './api-keys.ts';
import { userRoutes } from './users.ts';
import { billingRoutes } from './billing.ts';
import { requestRoutes } from './requests.ts';
import { batchConsoleRoutes } from './batches.ts';

/**
 * Where every administration route is: under /{tenancy}/v1, matched as express matches its
 * routes (in any case, with or without a trailing slash).
 */
export const ADMIN_PATH = /^\/[^/]+\/v1(?:\/|$)/i;

/**
 * The administration routes. A request whose path is not under /{tenancy}/v1 (a console page, a
 * path nothing serves) leaves the router at its first step instead of being tried against each
 * of its routes in turn. Service calls (/{tenancy}/{namespace}/v1/...) are routed before it (routes.ts).
 */
export function adminRouter(deps: Deps): Router {
  const router = express.Router();
  router.use((req, _res, next) => next(ADMIN_PATH.test(req.path) ? undefined : 'router'));
  sessionRoutes(deps, router);
  tenancyRoutes(deps, router);
  namespaceRoutes(deps, router);
  backendRoutes(deps, router);
  routingRuleRoutes(deps, router);
  apiKeyRoutes(deps, router);
  userRoutes(deps, router);
  billingRoutes(deps, router);
  requestRoutes(deps, router);
  batchConsoleRoutes(deps, router);
  return router;
}
