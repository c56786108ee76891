// The executor half: graphile-worker delivering `execute_request` jobs to this process.
import { run, type Runner } from 'graphile-worker';
import type { Deps } from '../deps.ts';
import { newId } from '../core/ids.ts';
import { createUpstream } from './upstream.ts';
import { createChunkWriter } from './chunk-writer.ts';
import { workerLogger } from './worker-logger.ts';
import { executeRequestTask, EXECUTE_REQUEST } from '../../tasks/execute_request.ts';

// Provider calls are I/O-bound: one process holds many at once.
const CONCURRENCY = 128;

export type Executor = { owner: string; stop(): Promise<void> };

export async function startExecutor(deps: Deps): Promise<Executor> {
  const owner = newId('wrk');
  const upstream = createUpstream();
  const executorDeps = { ...deps, upstream, owner, chunks: createChunkWriter(deps.pool, deps.bus) };
  let runner: Runner;
  try {
    runner = await run({
      pgPool: deps.pool,
      concurrency: CONCURRENCY,
      noHandleSignals: true,
      pollInterval: 1000,
      logger: workerLogger,
      taskList: { [EXECUTE_REQUEST]: executeRequestTask(executorDeps) },
    });
  } catch (err) {
    await upstream.close();
    throw err;
  }
  return {
    owner,
    async stop() {
      await runner.stop();
      await upstream.close();
    },
  };
}
