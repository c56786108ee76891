// The executor half: the runner of attempts, graphile-worker delivering `execute_request` jobs
// to it, the recovery and retention sweeps, and a graceful stop that hands back what cannot
// finish in time. graphile-worker has a small pool of its own, so its polling and job
// completion never queue behind request traffic; it fetches jobs in batches (its local queue)
// and completes them in batches.
import { EventEmitter } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { run, type Runner as WorkerRunner, type WorkerEvents } from 'graphile-worker';
import type { BaseDeps } from '../deps.ts';
import { createPool, connectionFailed, type ConnectionConfig, type Pool } from '../db/pool.ts';
import { createUpstream } from './upstream.ts';
import { createChunkWriter } from './chunk-writer.ts';
import { createRunner, type Runner } from './runner.ts';
import { startSweeper } from './sweep.ts';
import { startRetentionSweeper } from './retention.ts';
import { workerLogger } from '../db/worker-logger.ts';
import { logger } from '../log.ts';
import { executeRequestTask } from '../../tasks/execute_request.ts';
import { EXECUTE_REQUEST, unlockJobs } from '../db/jobs.ts';

export type Executor = { runner: Runner; stop(graceMs: number): Promise<void> };

/** `concurrency` bounds the attempts this process runs at once, however they came. */
export async function startExecutor(deps: BaseDeps, conn: ConnectionConfig, opts: { concurrency: number }): Promise<Executor> {
  const upstream = createUpstream();
  // Writes of an attempt are retried through an outage for as long as its lease could last.
  const chunks = createChunkWriter(conn, deps.bus, deps.processId, () => deps.settings.current().lease_ms);
  const executorDeps = { ...deps, upstream, chunks };
  const runner = createRunner(executorDeps, { owner: deps.processId, concurrency: opts.concurrency });
  // graphile-worker's own pool. It opens only what it uses (its LISTEN client, one job fetch and
  // one completion batch at a time: task code uses the main pool); the bound matches the
  // concurrency so graphile-worker has no reason to warn about it.
  const workerPool = createPool(conn, { max: opts.concurrency, name: 'sarsen-worker' });
  const startQueue = (events: WorkerEvents) =>
    run({
      pgPool: workerPool,
      concurrency: opts.concurrency,
      noHandleSignals: true,
      pollInterval: 1000,
      logger: workerLogger,
      events,
      taskList: { [EXECUTE_REQUEST]: executeRequestTask(runner) },
      preset: { worker: { localQueue: { size: opts.concurrency }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } },
    });
  let queue: JobQueue;
  try {
    queue = await superviseQueue(startQueue, workerPool);
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
        const stopped = queue.stop();
        await runner.stop(graceMs);
        await stopped;
        await Promise.all([upstream.close(), chunks.close(), workerPool.end()]);
      })()),
  };
}

type JobQueue = { stop(): Promise<void> };

/**
 * Keeps graphile-worker's runner going. graphile-worker stops its worker pool for good when it
 * cannot complete or fail jobs (the database went away under it); this starts a new one once
 * the database answers again, and frees the jobs the stopped pool had locked (run again, a
 * job whose request already ended claims nothing and completes).
 */
async function superviseQueue(start: (events: WorkerEvents) => Promise<WorkerRunner>, pool: Pool): Promise<JobQueue> {
  const launch = async () => {
    const events: WorkerEvents = new EventEmitter() as WorkerEvents;
    const lockers: string[] = [];
    events.on('pool:create', ({ workerPool }) => lockers.push(workerPool.id));
    events.on('worker:create', ({ worker }) => lockers.push(worker.workerId));
    return { runner: await start(events), lockers };
  };
  let current = await launch();
  let stopping = false;
  const supervised = (async () => {
    for (;;) {
      const error = await current.runner.promise.then(() => null, (err: unknown) => err);
      if (stopping) return;
      connectionFailed('the job queue stopped; starting it again', error ?? new Error('the job queue stopped'));
      const previous = current.lockers;
      for (let delay = 100; ; delay = Math.min(delay * 2, 1000)) {
        await sleep(delay);
        if (stopping) return;
        try {
          current = await launch();
          break;
        } catch (err) {
          connectionFailed('the job queue could not start', err);
        }
      }
      logger.info('job queue running again');
      for (let tries = 0; tries < 20 && !stopping; tries++) {
        try {
          await unlockJobs(pool, previous);
          break;
        } catch (err) {
          connectionFailed('could not free the stopped job queue\'s jobs', err);
          await sleep(500);
        }
      }
    }
  })();
  return {
    async stop() {
      stopping = true;
      await current.runner.stop().catch(() => undefined);
      await supervised;
    },
  };
}
