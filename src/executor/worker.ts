// The executor half: the attempt runner, graphile-worker delivering `execute_request` jobs
// to it, the recovery and retention sweeps, and a graceful stop that hands back what cannot
// finish in time. graphile-worker has a small pool of its own, so its polling and job
// completion never queue behind request traffic; it fetches jobs in batches (its local queue)
// and completes them in batches.
import { EventEmitter } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { run, type Runner as WorkerRunner, type WorkerEvents, type WorkerPool } from 'graphile-worker';
import type { BaseDeps, RunWhereAccepted } from '../deps.ts';
import { createPool, connectionFailed, gateConnections, isConnectionLoss, type ConnectionConfig, type Pool } from '../db/pool.ts';
import { createUpstream } from './upstream.ts';
import { createChunkWriter } from './chunk-writer.ts';
import { createAttemptRunner } from './attempt-runner.ts';
import { startSweeper } from './sweep.ts';
import { startRetentionSweeper } from './retention.ts';
import { createActivity } from './activity.ts';
import { startLoop } from './loop.ts';
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
  // Whether work runs in the deployment: the loops below look often only while it does.
  const activity = createActivity(deps.pool, deps.bus);
  const attemptRunner = createAttemptRunner(executorDeps, { owner: deps.processId, concurrency: opts.concurrency, activity });
  // graphile-worker's own pool, of the process's budget (its `queue` connections): its LISTEN
  // client, one job fetch and one completion batch at a time; task code uses the other pools.
  // Never below those three: with one connection its LISTEN client held it and no job was fetched.
  const workerPool = createPool(conn, { max: Math.max(opts.concurrency, 3), name: 'sarsen-worker', purpose: 'queue' });
  const startQueue = (events: WorkerEvents) =>
    run({ ...queueOptions(opts.concurrency), pgPool: workerPool, events, taskList: { [EXECUTE_REQUEST]: executeRequestTask(attemptRunner.runJob) } });
  // Recovery first: a process started because all the others died takes up their work at once.
  const sweeper = startSweeper(deps, opts.liveness, activity);
  const listing: JobPoolListing = {
    add: (id) => opts.liveness.addJobPool(deps.pool, id).catch((err) => connectionFailed('could not list a job pool; its jobs are freed late if this process dies', err)),
    drop: (id) => opts.liveness.dropJobPool(deps.pool, id).catch((err) => connectionFailed('could not unlist a stopped job pool', err)),
  };
  let queue: JobQueue;
  try {
    queue = await superviseQueue(startQueue, workerPool, listing);
  } catch (err) {
    await Promise.all([sweeper.stop(), attemptRunner.stop(0)]);
    activity.close();
    await Promise.all([upstream.close(), chunks.close(), workerPool.end()]);
    throw err;
  }
  // New jobs this process was chosen to fetch (sql/migrations/019_bus_channels.sql), and, after
  // the bus reconnected, any whose news it may have missed.
  const unsubscribe = deps.bus.subscribe('jobs', (m) => queue.nudge(Number(m.count) || 1));
  const unReconnect = deps.bus.onReconnect(() => queue.nudge(opts.concurrency));
  // graphile-worker polls only as a slow backstop (queueOptions). While work runs, the queue is
  // looked at every BUSY_FETCH_MS, as it was when it polled every second: a job whose wake went
  // to a process that was full, or to one that just died, waits no longer than that. While the
  // deployment is idle, the watching executor alone looks every IDLE_FETCH_MS (a due job it finds
  // is work, which the others then hear of).
  let fetchedAt = performance.now();
  const fetcher = startLoop(async () => {
    const now = performance.now();
    if (activity.busy() || (opts.liveness.watches() && now - fetchedAt >= IDLE_FETCH_MS)) {
      fetchedAt = now;
      queue.nudge(opts.concurrency);
    }
    return BUSY_FETCH_MS;
  }, { firstDelayMs: BUSY_FETCH_MS, failed: () => BUSY_FETCH_MS });
  const retention = startRetentionSweeper(deps, { watches: () => opts.liveness.watches(), busy: () => activity.busy() });
  logger.info('executor started', { owner: deps.processId, concurrency: opts.concurrency });
  let stopping: Promise<void> | null = null;
  return {
    runWhereAccepted: attemptRunner,
    stop: (graceMs) =>
      (stopping ??= (async () => {
        unsubscribe();
        unReconnect();
        await Promise.all([sweeper.stop(), retention.stop(), fetcher.stop()]);
        // No new jobs from here on; running attempts get the grace to finish (and are announced meanwhile).
        const stopped = queue.stop();
        await attemptRunner.stop(graceMs);
        await stopped;
        activity.close();
        await opts.liveness.leave(deps.pool).catch((err) => connectionFailed('could not unlist this executor; the watcher will', err));
        await Promise.all([upstream.close(), chunks.close(), workerPool.end()]);
      })()),
  };
}

// graphile-worker's own poll for due jobs, a backstop: new jobs wake a process through the bus, a
// retry is fetched at its time by the process that scheduled it (src/executor/settle.ts), and
// the executor looks itself, every BUSY_FETCH_MS while work runs and, on the watching executor,
// every IDLE_FETCH_MS while the deployment is idle (docs/scaling.md "An idle process").
export const POLL_INTERVAL_MS = 60_000;
const BUSY_FETCH_MS = 1_000;
const IDLE_FETCH_MS = 10_000;

/** How the executor runs graphile-worker (its conformance test runs it the same way). */
export function queueOptions(concurrency: number) {
  return {
    concurrency,
    noHandleSignals: true,
    pollInterval: POLL_INTERVAL_MS,
    logger: workerLogger,
    preset: { worker: { localQueue: { size: concurrency }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } },
  } satisfies Parameters<typeof run>[0];
}

/** Where this process lists its job pools (src/db/liveness.ts); neither call may throw. */
export type JobPoolListing = { add(poolId: string): Promise<void>; drop(poolId: string): Promise<void> };

export type JobQueue = { /** Has the running worker pool fetch `count` new jobs now. */ nudge(count: number): void; stop(): Promise<void> };

// How long after its jobs ended a pool's last completions may still be on their way.
const COMPLETIONS_SENT_MS = 1000;

/** One launch of graphile-worker: its runner, and what the supervisor watches of it. */
type Launched = {
  runner: WorkerRunner;
  /** Its pool's id, as listed. */
  poolId: string | undefined;
  /** The ids of its pool and workers, which lock the jobs it takes. */
  lockers: string[];
  nudge(count: number): void;
  /** Resolves, with the reason, once its pool stops taking jobs. */
  down: Promise<Error>;
  /** Resolves once its pool's jobs have ended (run out, or been failed back to the queue). */
  drained: Promise<void>;
};

/**
 * Keeps a graphile-worker pool taking jobs. graphile-worker shuts a pool down by itself when
 * it cannot complete a job (the database went away under it, docs/durability.md "During an
 * outage"). Such a pool drains first: it takes no job while its running jobs, which are
 * provider calls that may last minutes, finish. So a replacement starts as soon as a pool goes
 * down, once the database answers, and the jobs the old pool still holds locked are freed once
 * it has drained (run again, a job whose request already ended claims nothing and completes).
 * Until then the process may run up to twice its concurrency.
 *
 * A pool is done with once drained, not once its runner settles: graphile-worker 0.18's
 * batched completion miscounts after a failed batch, and such a pool's runner never settles
 * (graphile/worker#636).
 *
 * Each new worker pool is listed (`listing.add`) before it takes a connection
 * from `pool`, so before it locks a job: a pool fetches at once on creation, and graphile-worker
 * has no hook to wait, so `pool` is held until the listing is done. A process that dies after
 * fetching thus has its jobs freed by the watcher at once rather than after a lease. A pool
 * whose jobs were freed after it stopped is unlisted (`listing.drop`).
 */
export async function superviseQueue(start: (events: WorkerEvents) => Promise<WorkerRunner>, pool: Pool, listing: JobPoolListing): Promise<JobQueue> {
  const gate = gateConnections(pool);
  let stopping = false;
  const stopRequested = Promise.withResolvers<null>();
  const launched = new Set<Launched>();
  const launch = async (): Promise<Launched> => {
    const events: WorkerEvents = new EventEmitter() as WorkerEvents;
    const lockers: string[] = [];
    let jobPool: WorkerPool | null = null;
    const down = Promise.withResolvers<Error>();
    const drained = Promise.withResolvers<void>();
    events.on('pool:create', ({ workerPool }) => {
      lockers.push(workerPool.id);
      jobPool = workerPool;
      // Emitted synchronously just before the pool's first fetch asks for a connection.
      gate.holdUntil(listing.add(workerPool.id));
    });
    events.on('worker:create', ({ worker }) => lockers.push(worker.workerId));
    events.on('pool:gracefulShutdown', ({ message }) => down.resolve(new Error(message)));
    events.on('pool:forcefulShutdown', ({ message }) => down.resolve(new Error(message)));
    // A graceful shutdown that fails goes on to a forceful one, which always ends in one of these.
    // The last jobs' completions are sent a moment later; freed before that, they would run again.
    const ended = () => void sleep(COMPLETIONS_SENT_MS).then(() => drained.resolve());
    events.on('pool:gracefulShutdown:complete', ended);
    events.on('pool:forcefulShutdown:complete', ended);
    events.on('pool:forcefulShutdown:error', ended);
    const runner = await start(events);
    void runner.promise.then(
      () => down.resolve(new Error('the job queue stopped')),
      (err: unknown) => down.resolve(err instanceof Error ? err : new Error(String(err))),
    ).finally(() => drained.resolve());
    const queue: Launched = { runner, poolId: lockers[0], lockers, nudge: (count) => jobPool?.nudge(count), down: down.promise, drained: drained.promise };
    launched.add(queue);
    return queue;
  };

  /** Frees the jobs a stopped pool still holds; true once done. */
  const freeJobs = async (lockers: readonly string[]): Promise<boolean> => {
    for (let tries = 0; tries < 20 && !stopping; tries++) {
      try {
        await unlockJobs(pool, lockers);
        return true;
      } catch (err) {
        connectionFailed('could not free the stopped job queue\'s jobs', err);
        await sleep(500);
      }
    }
    return false;
  };
  const retire = async (queue: Launched) => {
    await queue.drained;
    const freed = await freeJobs(queue.lockers);
    // Freed jobs are due at once, and nothing else announces them: the running pool fetches now.
    if (freed) current?.nudge(queue.lockers.length);
    if (freed && queue.poolId) await listing.drop(queue.poolId);
    launched.delete(queue);
  };
  /** Launches a pool, retrying until the database answers; null if the queue stops meanwhile. */
  const relaunch = async (): Promise<Launched | null> => {
    for (let delay = 100; ; delay = Math.min(delay * 2, 1000)) {
      await sleep(delay);
      if (stopping) return null;
      try {
        return await launch();
      } catch (err) {
        connectionFailed('the job queue could not start', err);
      }
    }
  };

  let current: Launched | null = await launch();
  const supervised = (async () => {
    while (current) {
      const reason = await Promise.race([current.down, stopRequested.promise]);
      if (!reason) return;
      if (isConnectionLoss(reason)) connectionFailed('the job queue stopped taking jobs', reason);
      else logger.warn('the job queue stopped taking jobs; starting another', { reason: reason.message });
      void retire(current);
      current = await relaunch();
      if (current) logger.info('job queue running again');
    }
  })();
  return {
    nudge: (count) => current?.nudge(count),
    async stop() {
      stopping = true;
      stopRequested.resolve(null);
      await supervised;
      // A pool already going down is not asked again; each is awaited until its jobs ended.
      for (const queue of launched) void queue.runner.stop().catch(() => undefined);
      await Promise.all([...launched].map((queue) => queue.drained));
    },
  };
}
