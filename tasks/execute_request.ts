// graphile-worker task `execute_request`: its payload names a request; the row says the rest.
// The job key is the request id, so `graphile_worker.jobs where key = 'req_…'` finds its work.
import type { Task } from 'graphile-worker';
import { z } from 'zod';
import { RECOVERY_PRIORITY } from '../src/db/jobs.ts';

export const payloadSchema = z.object({ request_id: z.string().startsWith('req_') });

/** `runJob`: the executor's attempt runner claiming the named request and running it. */
export function executeRequestTask(runJob: (requestId: string, opts: { callerWaits: boolean }) => Promise<void>): Task {
  return async (payload, helpers) => {
    const { request_id } = payloadSchema.parse(payload);
    // A re-dispatched attempt may have readers waiting: it does not yield to acceptance.
    await runJob(request_id, { callerWaits: helpers.job.priority <= RECOVERY_PRIORITY });
  };
}
