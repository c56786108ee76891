// POST .../requests/{id}/cancel (issue 18), shared by the key route and the console's session
// route: a pending request ends here, a running one is marked and its process told through the bus.
import type { Request, Response } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { cancelRequest } from '../../db/cancel.ts';

export async function cancelHandler(deps: Deps, req: Request, res: Response, namespaceId: string): Promise<void> {
  const id = String(req.params.id);
  const done = await cancelRequest(deps.pool, namespaceId, id, { metering: deps.settings.current().metering_enabled, origin: deps.processId });
  if (!done) throw new ServiceError('not_found', 'No such request in this namespace.');
  if (done.kind === 'finished') throw new ServiceError('conflict', `The request has already ${done.status}.`);
  if (done.kind === 'cancelling') {
    deps.bus.publishRequest({ type: 'cancel', requestId: id });
    res.status(202).json({ request_id: id, status: 'running' });
    return;
  }
  if (done.answer) deps.bus.publishRequest({ type: 'state', requestId: id, status: 'failed', answer: done.answer });
  res.status(200).json({ request_id: id, status: 'failed' });
}
