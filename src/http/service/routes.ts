// The service routes under /{tenancy}/{namespace}/v1 (SPEC.md "Endpoints"). Authentication is
// per route, so an unknown path below the base still answers 404.
import express, { type Request, type Response, type Router } from 'express';
import type { Deps } from '../../deps.ts';
import { serviceAuth, serviceAuthOf } from '../service-auth.ts';
import { ServiceError } from '../../core/errors.ts';
import { acceptSubmission } from './submit.ts';
import { readRequest } from './record.ts';
import { heldAnswer, liveStream } from './streams.ts';
import { accountRoutes, keyScope } from './accounts.ts';
import type { Dialect } from '../../db/requests.ts';
import { cancelHandler } from './cancel.ts';
import { noteSubmission } from '../observe.ts';
import { trackStream } from '../../metrics/metrics.ts';

const BASE = '/:tenancy/:namespace/v1';

async function synchronous(deps: Deps, req: Request, res: Response, dialect: Dialect): Promise<void> {
  const auth = serviceAuthOf(res);
  const sub = await acceptSubmission(deps, req, auth, dialect, { fireAndForget: false });
  noteSubmission(res, sub);
  const hold = deps.settings.current().synchronous_hold_ms;
  const watched = { id: sub.requestId, namespaceId: auth.namespaceId, streaming: sub.streaming };
  // A request this submission started has nothing stored yet: its watch reads nothing until
  // an event says something happened.
  const fresh = !sub.attached;
  if (sub.streaming) await trackStream('live', () => liveStream(deps, res, watched, hold, fresh));
  else await heldAnswer(deps, res, watched, hold, fresh);
}

export function serviceRouter(deps: Deps): Router {
  const router = express.Router();
  const use = serviceAuth(deps, 'use');

  router.post(`${BASE}/chat/completions`, use, (req, res) => synchronous(deps, req, res, 'chat'));
  router.post(`${BASE}/messages`, use, (req, res) => synchronous(deps, req, res, 'messages'));

  router.post(`${BASE}/requests`, use, async (req, res) => {
    const dialect = req.query.dialect ?? 'chat';
    if (dialect !== 'chat' && dialect !== 'messages') {
      throw new ServiceError('bad_request', 'The `dialect` parameter must be `chat` or `messages`.');
    }
    const sub = await acceptSubmission(deps, req, serviceAuthOf(res), dialect, { fireAndForget: true });
    noteSubmission(res, sub);
    res.status(202).json({ request_id: sub.requestId, status: sub.status });
  });

  accountRoutes(deps, router, keyScope(deps, BASE));

  router.post(`${BASE}/requests/:id/cancel`, use, (req, res) => cancelHandler(deps, req, res, serviceAuthOf(res).namespaceId));

  router.get(`${BASE}/requests/:id`, use, (req, res) => readRequest(deps, req, res, serviceAuthOf(res).namespaceId));

  return router;
}
