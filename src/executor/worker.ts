// The executor half: the runner of attempts, graphile-worker delivering `execute_request` jobs
// to it, the recovery and retention sweeps, and a graceful stop that hands back what cannot
// finish in time. graphile-worker has a small pool of its own, so its polling and job
// completion never queue behind request traffic; it fetches jobs in batches (its local queue)
// and completes them in batches.
import { run, type Runner as WorkerRunner } from 'graphile-worker';
import type { BaseDeps } from '../deps.ts';
import { createPool, type ConnectionConfig } from '../db/pool.ts';
import { createUpstream } from './upstream.ts';
import { createChunkWriter } from './chunk-writer.ts';
import { createRunner, type Runner } from './runner.ts';
import { startSweeper } from './sweep.ts';
import { startRetentionSweeper } from './retention.ts';
import { workerLogger } from './worker-logger.ts';
import { logger } from '../log.ts';
import { executeRequestTask } from '../../tasks/execute_request.ts';
import { EXECUTE_REQUEST } from '../db/jobs.ts';

export type Executor = { runner: Runner; stop(graceMs: number): Promise<void> };

/** `concurrency` bounds the attempts this process runs at once, however they came. */
export async function startExecutor(deps: BaseDeps, conn: ConnectionConfig, opts: { concurrency: number }): Promise<Executor> {
  const upstream = createUpstream();
  const chunks = createChunkWriter(conn, deps.bus, deps.processId);
  const executorDeps = { ...deps, upstream, chunks };
  const runner = createRunner(executorDeps, { owner: deps.processId, concurrency: opts.concurrency });
  // graphile-worker's own pool. It opens only what it uses (its LISTEN client, one job fetch and
  // one completion batch at a time: task code uses the main pool); the bound matches the
  // concurrency so graphile-worker has no reason to warn about it.
  const workerPool = createPool(conn, { max: opts.concurrency, name: 'sarsen-worker' });
  let worker: WorkerRunner;
  try {
    worker = await run({
      pgPool: workerPool,
      concurrency: opts.concurrency,
      noHandleSignals: true,
      pollInterval: 1000,
      logger: workerLogger,
      taskList: { [EXECUTE_REQUEST]: executeRequestTask(runner) },
      preset: { worker: { localQueue: { size: opts.concurrency }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } },
    });
  } catch (err) {
    await runner.stop(0);
    await Promise.all([upstream.close(), chunks.close(), workerPool.end()]);
    throw err;
  }
  const sweeper = startSweeper(deps, deps.processId);
  const retention = startRetentionSweeper(deps);
  logger.info('executor started', { owner: deps.processId, concurrency: opts.concurrency });
  let stopping: Promise<void> | null = null;
  return {
    runner,
    stop: (graceMs) =>
      (stopping ??= (async () => {
        await Promise.all([sweeper.stop(), retention.stop()]);
        // No new jobs from here on; running attempts get the grace to finish.
        const stopped = worker.stop();
        await runner.stop(graceMs);
        await stopped;
        await Promise.all([upstream.close(), chunks.close(), workerPool.end()]);
      })()),
  };
}
