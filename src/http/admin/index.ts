// The administration routes under /{tenancy}/v1/... (docs/administration.md "Administration
// routes"). Each route carries its own session check, so unknown paths still fall through to the
// 404 handler.
import express, { type RequestHandler, type Router } from 'express';
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
 * The administration routes, entered only by a path under /{tenancy}/v1: any other request (a
 * service call is /{tenancy}/{namespace}/v1/...) goes on at once instead of being tried against
 * each of their routes in turn (issue 44: a few µs of CPU a request).
 */
export function adminRouter(deps: Deps): RequestHandler {
  const router = adminRoutes(deps);
  return (req, res, next) => {
    if (ADMIN_PATH.test(req.path)) router(req, res, next);
    else next();
  };
}

/** Every administration route, each under ADMIN_PATH. */
export function adminRoutes(deps: Deps): Router {
  const router = express.Router();
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
