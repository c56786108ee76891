// graphile-worker logs through our winston logger, so its lines are JSON like ours.
import { Logger } from 'graphile-worker';
import { logger } from '../log.ts';
import { connectionFailed, isConnectionLoss } from './pool.ts';

const LEVELS = { error: 'error', warning: 'warn', info: 'debug', debug: 'debug' } as const;

export const workerLogger = new Logger((scope) => (level, message, meta) => {
  // A database outage is logged once per process (src/db/pool.ts), not by every job it meets.
  const err = meta?.error ?? meta?.fatalError;
  if (level !== 'debug' && level !== 'info' && err !== undefined && isConnectionLoss(err)) {
    connectionFailed(message, err);
    return;
  }
  // Its pool is sized by the process's connection budget, not by the concurrency: task code
  // does not use it (src/executor/worker.ts), so its warning about that says nothing.
  if (message.startsWith('WARNING: having maxPoolSize')) return;
  // graphile-worker's info lines (worker started, job completed) are routine; keep them at debug.
  logger.log(LEVELS[level], message, { component: 'graphile-worker', job_id: scope.jobId, task: scope.taskIdentifier });
});
