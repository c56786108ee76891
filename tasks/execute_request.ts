// graphile-worker task `execute_request`: its payload names a request; the row says the rest.
// The job key is the request id, so `graphile_worker.jobs where key = 'req_…'` finds its work.
import type { Task } from 'graphile-worker';
import { z } from 'zod';
import type { Runner } from '../src/executor/runner.ts';

export const payloadSchema = z.object({ request_id: z.string().startsWith('req_') });

export function executeRequestTask(runner: Runner): Task {
  return async (payload) => {
    const { request_id } = payloadSchema.parse(payload);
    await runner.runJob(request_id);
  };
}
