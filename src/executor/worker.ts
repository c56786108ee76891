// The executor half: the attempt runner, graphile-worker delivering `execute_request` jobs
// to it, the recovery and retention sweeps, and a graceful stop that hands back what cannot
// finish in time. graphile-worker has a small pool of its own, so its polling and job
// completion never queue behind request traffic; it fetches jobs in batches (its local queue)
// and completes them in batches.
import { EventEmitter } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { run, type Runner as WorkerRunner, type WorkerEvents, type WorkerPool } from 'graphile-worker';
import type { BaseDeps, RunWhereAccepted } from '../deps.ts';
import { createPool, connectionFailed, gateConnections, type ConnectionConfig, type Pool } from '../db/pool.ts';
import { createUpstream } from './upstream.ts';
import { createChunkWriter } from './chunk-writer.ts';
import { createAttemptRunner } from './attempt-runner.ts';
import { startSweeper } from './sweep.ts';
import { startRetentionSweeper } from './retention.ts';
import { workerLogger } from '../db/worker-logger.ts';
import { logger } from '../log.ts';
import { executeRequestTask } from '../../tasks/execute_request.ts';
import { EXECUTE_REQUEST, unlockJobs } from '../db/jobs.ts';
import type { Liveness } from '../db/liveness.ts';

/** `runWhereAccepted`: the hand-off from acceptance in this process (wired in server.ts). */
export type Executor = { runWhereAccepted: RunWhereAccepted; stop(graceMs: number): Promise<void> };

/**
 * `concurrency` bounds the attempts this process runs at once, however they came. `liveness`
 * lists this process and its job pools, and tells whether it watches the other executors.
 */
export async function startExecutor(deps: BaseDeps, conn: ConnectionConfig, opts: { concurrency: number; liveness: Liveness }): Promise<Executor> {
  const upstream = createUpstream();
  // Writes of an attempt are retried through an outage for as long as its lease could last.
  const chunks = createChunkWriter(conn, deps.bus, deps.processId, () => deps.settings.current().lease_ms);
  const executorDeps = { ...deps, upstream, chunks };
  const attemptRunner = createAttemptRunner(executorDeps, { owner: deps.processId, concurrency: opts.concurrency });
  // graphile-worker's own pool, of the process's budget (its `queue` connections): its LISTEN
  // client, one job fetch and one completion batch at a time; task code uses the other pools.
  // Never below those three: with one connection its LISTEN client held it and no job was fetched.
  const workerPool = createPool(conn, { max: Math.max(opts.concurrency, 3), name: 'sarsen-worker', purpose: 'queue' });
  const startQueue = (events: WorkerEvents) =>
    run({ ...queueOptions(opts.concurrency), pgPool: workerPool, events, taskList: { [EXECUTE_REQUEST]: executeRequestTask(attemptRunner.runJob) } });
  // Recovery first: a process started because all the others died takes up their work at once.
  const sweeper = startSweeper(deps, opts.liveness);
  const listPool = (id: string) =>
    opts.liveness.addJobPool(deps.pool, id).catch((err) => connectionFailed('could not list a job pool; its jobs are freed late if this process dies', err));
  let queue: JobQueue;
  try {
    queue = await superviseQueue(startQueue, workerPool, listPool);
  } catch (err) {
    await Promise.all([sweeper.stop(), attemptRunner.stop(0)]);
    await Promise.all([upstream.close(), chunks.close(), workerPool.end()]);
    throw err;
  }
  // New jobs this process was chosen to fetch (sql/migrations/019_bus_channels.sql).
  const unsubscribe = deps.bus.subscribe('jobs', (m) => queue.nudge(Number(m.count) || 1));
  const retention = startRetentionSweeper(deps);
  logger.info('executor started', { owner: deps.processId, concurrency: opts.concurrency });
  let stopping: Promise<void> | null = null;
  return {
    runWhereAccepted: attemptRunner.runWhereAccepted,
    stop: (graceMs) =>
      (stopping ??= (async () => {
        unsubscribe();
        await Promise.all([sweeper.stop(), retention.stop()]);
        // No new jobs from here on; running attempts get the grace to finish.
        const stopped = queue.stop();
        await attemptRunner.stop(graceMs);
        await stopped;
        await opts.liveness.leave(deps.pool).catch((err) => connectionFailed('could not unlist this executor; the watcher will', err));
        await Promise.all([upstream.close(), chunks.close(), workerPool.end()]);
      })()),
  };
}

/** How the executor runs graphile-worker (its conformance test runs it the same way). */
export function queueOptions(concurrency: number) {
  return {
    concurrency,
    noHandleSignals: true,
    pollInterval: 1000,
    logger: workerLogger,
    preset: { worker: { localQueue: { size: concurrency }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } },
  } satisfies Parameters<typeof run>[0];
}

export type JobQueue = { /** Has the running worker pool fetch `count` new jobs now. */ nudge(count: number): void; stop(): Promise<void> };

/**
 * Keeps graphile-worker's runner going. graphile-worker stops its worker pool for good when it
 * cannot complete or fail jobs (the database went away under it); this starts a new one once
 * the database answers again, and frees the jobs the stopped pool had locked (run again, a
 * job whose request already ended claims nothing and completes).
 *
 * Each new worker pool is listed (`list`, which must not throw) before it takes a connection
 * from `pool`, so before it locks a job: a pool fetches at once on creation, and graphile-worker
 * has no hook to wait, so `pool` is held until the listing is done. A process that dies after
 * fetching thus has its jobs freed by the watcher at once rather than after a lease.
 */
export async function superviseQueue(start: (events: WorkerEvents) => Promise<WorkerRunner>, pool: Pool, list: (id: string) => Promise<void>): Promise<JobQueue> {
  const gate = gateConnections(pool);
  const launch = async () => {
    const events: WorkerEvents = new EventEmitter() as WorkerEvents;
    const lockers: string[] = [];
    let jobPool: WorkerPool | null = null;
    events.on('pool:create', ({ workerPool }) => {
      lockers.push(workerPool.id);
      jobPool = workerPool;
      // Emitted synchronously just before the pool's first fetch asks for a connection.
      gate.holdUntil(list(workerPool.id));
    });
    events.on('worker:create', ({ worker }) => lockers.push(worker.workerId));
    const runner = await start(events);
    return { runner, lockers, nudge: (count: number) => jobPool?.nudge(count) };
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
    nudge: (count) => current.nudge(count),
    async stop() {
      stopping = true;
      await current.runner.stop().catch(() => undefined);
      await supervised;
    },
  };
}
