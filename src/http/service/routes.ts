// The service routes under /{tenancy}/{namespace}/v1 (docs/api.md "Service routes").
// Authentication is per route, so an unknown path below the base still answers 404.
import express, { type Request, type Response, type Router } from 'express';
import type { Deps } from '../../deps.ts';
import { serviceAuth, serviceAuthOf } from '../service-auth.ts';
import { ServiceError } from '../../core/errors.ts';
import { acceptSubmission } from './submit.ts';
import { readRequest } from './record.ts';
import { heldAnswer, liveStream } from './streams.ts';
import { accountRoutes, keyScope } from './accounts.ts';
import { isDialect, type Dialect } from '../../core/dialects.ts';
import { exportRoute } from './export.ts';
import { cancelHandler } from './cancel.ts';
import { noteSubmission } from '../observe.ts';
import { trackStream } from '../../metrics/metrics.ts';
import { answerBackground, backgroundRoutes } from './background.ts';
import { fileRoutes } from './files.ts';
import { batchRoutes } from './batches.ts';
import { messageBatchRoutes } from './batches-anthropic.ts';

const BASE = '/:tenancy/:namespace/v1';
// Names the request whose stored answer the response cache served (docs/api.md "Response cache").
const CACHED_FROM_HEADER = 'x-sarsen-cached-from';
// Names the request a synchronous answer comes from, so a client can resume it by id (docs/clients.md).
const REQUEST_ID_HEADER = 'x-sarsen-request-id';

async function synchronous(deps: Deps, req: Request, res: Response, dialect: Dialect): Promise<void> {
  const auth = serviceAuthOf(res);
  // Accepted (and, in a process that also executes, claimed and running: see server.ts).
  const accepted = await acceptSubmission(deps, req, auth, dialect, { fireAndForget: false });
  noteSubmission(res, accepted);
  res.set(REQUEST_ID_HEADER, accepted.requestId);
  // In the background without a stream: the Response as it stands, at once. With a stream, the
  // events, as for any stream (the caller may leave at any point).
  // Sarsen acts on one body field, the Responses `background` (docs/api.md "Background responses").
  if (accepted.background && !accepted.streaming) return answerBackground(deps, res, accepted);
  const hold = deps.settings.current().synchronous_hold_ms;
  const watched = { id: accepted.requestId, namespaceId: auth.namespaceId, streaming: accepted.streaming };
  // A request this submission started has nothing stored yet: its watch reads nothing until
  // an event says something happened. One answered from the response cache is stored already.
  const fresh = !accepted.attached && accepted.cachedFrom === null;
  if (accepted.cachedFrom !== null) res.set(CACHED_FROM_HEADER, accepted.cachedFrom);
  if (accepted.streaming) await trackStream('live', () => liveStream(deps, res, watched, hold, fresh));
  else await heldAnswer(deps, res, watched, hold, fresh);
}

export function serviceRouter(deps: Deps): Router {
  const router = express.Router();
  const use = serviceAuth(deps, 'use');

  router.post(`${BASE}/chat/completions`, use, (req, res) => synchronous(deps, req, res, 'chat'));
  router.post(`${BASE}/messages`, use, (req, res) => synchronous(deps, req, res, 'messages'));
  router.post(`${BASE}/responses`, use, (req, res) => synchronous(deps, req, res, 'responses'));

  router.post(`${BASE}/requests`, use, async (req, res) => {
    const dialect = req.query.dialect ?? 'chat';
    if (!isDialect(dialect)) {
      throw new ServiceError('bad_request', 'The `dialect` parameter must be `chat`, `messages` or `responses`.');
    }
    const accepted = await acceptSubmission(deps, req, serviceAuthOf(res), dialect, { fireAndForget: true });
    noteSubmission(res, accepted);
    if (accepted.cachedFrom !== null) res.set(CACHED_FROM_HEADER, accepted.cachedFrom);
    res.status(202).json({ request_id: accepted.requestId, status: accepted.status });
  });

  accountRoutes(deps, router, keyScope(deps, BASE));
  exportRoute(deps, router, keyScope(deps, BASE));

  router.post(`${BASE}/requests/:id/cancel`, use, (req, res) => cancelHandler(deps, req, res, serviceAuthOf(res).namespaceId));

  backgroundRoutes(deps, router, BASE, use);
  // The vendors' batch APIs (docs/api.md "Batches").
  fileRoutes(deps, router, BASE, use);
  batchRoutes(deps, router, BASE, use);
  messageBatchRoutes(deps, router, BASE, use);

  router.get(`${BASE}/requests/:id`, use, (req, res) => readRequest(deps, req, res, serviceAuthOf(res).namespaceId));

  return router;
}
