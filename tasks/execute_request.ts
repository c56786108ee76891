// graphile-worker task `execute_request`: its payload names a request; the row says the rest.
// The job key is the request id, so `graphile_worker.jobs where key = 'req_…'` finds its work.
import type { Task } from 'graphile-worker';
import { executeRequest, payloadSchema, type ExecutorDeps } from '../src/executor/execute.ts';

export const EXECUTE_REQUEST = 'execute_request';

export function executeRequestTask(deps: ExecutorDeps): Task {
  return async (payload) => {
    const { request_id } = payloadSchema.parse(payload);
    await executeRequest(deps, request_id);
  };
}
