// The executor half: graphile-worker delivering `execute_request` jobs to this process, the
// recovery sweep, and a graceful stop that hands back what cannot finish in time.
import { run, type Runner } from 'graphile-worker';
import type { Deps } from '../deps.ts';
import { createUpstream } from './upstream.ts';
import { createChunkWriter } from './chunk-writer.ts';
import { startSweeper } from './sweep.ts';
import { startRetentionSweeper } from './retention.ts';
import { HandBack, type ActiveAttempt } from './execute.ts';
import { workerLogger } from './worker-logger.ts';
import { logger } from '../log.ts';
import { executeRequestTask, EXECUTE_REQUEST } from '../../tasks/execute_request.ts';

// Provider calls are I/O-bound: one process holds many at once.
const CONCURRENCY = 128;

export type Executor = { stop(graceMs: number): Promise<void> };

/** `owner` names this process's leases; its liveness lock is held on the bus connection. */
export async function startExecutor(deps: Deps, owner: string): Promise<Executor> {
  const upstream = createUpstream();
  const active = new Set<ActiveAttempt>();
  const executorDeps = { ...deps, upstream, owner, active, chunks: createChunkWriter(deps.pool, deps.bus) };
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
  const sweeper = startSweeper(deps, owner);
  const retention = startRetentionSweeper(deps);
  logger.info('executor started', { owner });
  let stopping: Promise<void> | null = null;
  return {
    stop: (graceMs) => (stopping ??= stop(graceMs)),
  };

  async function stop(graceMs: number): Promise<void> {
    await Promise.all([sweeper.stop(), retention.stop()]);
    // No new jobs from here on; running ones get the grace to finish.
    const stopped = runner.stop();
    const deadline = Date.now() + graceMs;
    while (active.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 25));
    for (const a of active) a.controller.abort(new HandBack('the process is stopping'));
    await stopped;
    await upstream.close();
  }
}
