// The service routes under /{tenancy}/{namespace}/v1 (SPEC.md "Endpoints"). Authentication is
// per route, so an unknown path below the base still answers 404.
import express, { type Request, type Response, type Router } from 'express';
import type { Deps } from '../../deps.ts';
import { serviceAuth, serviceAuthOf } from '../service-auth.ts';
import { ServiceError } from '../../core/errors.ts';
import { acceptSubmission } from './submit.ts';
import { recordJson } from './record.ts';
import { heldAnswer, liveStream, replay } from './streams.ts';
import { accountRoutes } from './accounts.ts';
import { readRecord, type Dialect } from '../../db/requests.ts';

const BASE = '/:tenancy/:namespace/v1';

async function synchronous(deps: Deps, req: Request, res: Response, dialect: Dialect): Promise<void> {
  const auth = serviceAuthOf(res);
  const sub = await acceptSubmission(deps, req, auth, dialect, { fireAndForget: false });
  const hold = deps.settings.current().synchronous_hold_ms;
  const watched = { id: sub.requestId, namespaceId: auth.namespaceId, streaming: sub.streaming };
  // A request this submission started has nothing stored yet: its watch reads nothing until
  // an event says something happened.
  const fresh = !sub.attached;
  if (sub.streaming) await liveStream(deps, res, watched, hold, fresh);
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
    res.status(202).json({ request_id: sub.requestId, status: sub.status });
  });

  accountRoutes(deps, router, BASE);

  router.get(`${BASE}/requests/:id`, use, async (req, res) => {
    const auth = serviceAuthOf(res);
    const record = await readRecord(deps.pool, auth.namespaceId, String(req.params.id));
    if (!record) throw new ServiceError('not_found', 'No such request in this namespace.');
    if (record.expired) throw new ServiceError('record_expired');
    if (/\btext\/event-stream\b/i.test(req.headers.accept ?? '')) {
      if (!record.streaming) {
        throw new ServiceError('bad_request', 'This request was not streamed; read it as JSON (without Accept: text/event-stream).');
      }
      await replay(deps, req, res, { id: record.id, namespaceId: record.namespace_id, streaming: true });
      return;
    }
    res.status(200).set('content-type', 'application/json').send(recordJson(record));
  });

  return router;
}
