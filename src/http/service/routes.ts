// The service routes under /{tenancy}/{namespace}/v1 (SPEC.md "Endpoints"). Authentication is
// per route, so an unknown path below the base still answers 404.
import express, { type Request, type Response, type Router } from 'express';
import type { Deps } from '../../deps.ts';
import { serviceAuth, serviceAuthOf } from '../service-auth.ts';
import { ServiceError } from '../../core/errors.ts';
import { acceptSubmission } from './submit.ts';
import { waitForTerminal } from './wait.ts';
import { recordJson } from './record.ts';
import { liveStream, replay } from './streams.ts';
import { accountRoutes } from './accounts.ts';
import { readRecord, type Dialect, type RecordRow } from '../../db/requests.ts';

const BASE = '/:tenancy/:namespace/v1';

/** The stored answer as the provider gave it: success or refusal byte for byte, or our 502. */
function sendStoredAnswer(res: Response, r: RecordRow): void {
  const body = r.response_body ?? Buffer.alloc(0);
  if (r.status === 'succeeded') {
    res.status(r.response_status ?? 200).set('content-type', r.response_content_type ?? 'application/json').send(body);
    return;
  }
  if (r.error_status !== null) {
    if (r.retry_after !== null) res.set('retry-after', r.retry_after);
    res.status(r.error_status).set('content-type', 'application/json').send(body);
    return;
  }
  // A failure that was not an HTTP answer: the stored body is our own upstream_failed envelope.
  res.status(502).set('content-type', 'application/json').send(body);
}

async function synchronous(deps: Deps, req: Request, res: Response, dialect: Dialect): Promise<void> {
  const auth = serviceAuthOf(res);
  const sub = await acceptSubmission(deps, req, auth, dialect, { fireAndForget: false });
  const hold = deps.settings.current().synchronous_hold_ms;
  if (sub.streaming) {
    await liveStream(deps, res, auth.namespaceId, sub.requestId, hold, (r) => sendStoredAnswer(res, r));
    return;
  }
  // The caller leaving ends the wait, never the execution.
  const left = new AbortController();
  res.on('close', () => left.abort());
  const status = await waitForTerminal(deps, sub.requestId, hold, left.signal);
  if (left.signal.aborted) {
    res.destroy(); // the caller is gone: release the connection, leave the execution running
    return;
  }
  if (status === null) {
    throw new ServiceError(
      'held_too_long',
      `Gave up waiting after ${hold} ms; the execution continues as request ${sub.requestId}. Re-send the identical body to attach to it, or read it by id.`,
    );
  }
  const record = await readRecord(deps.pool, auth.namespaceId, sub.requestId);
  if (!record) throw new Error(`request ${sub.requestId} vanished after settling`);
  sendStoredAnswer(res, record);
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
      await replay(deps, req, res, record);
      return;
    }
    res.status(200).set('content-type', 'application/json').send(recordJson(record));
  });

  return router;
}
