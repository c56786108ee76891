// graphile-worker logs through our winston logger, so its lines are JSON like ours.
import { Logger } from 'graphile-worker';
import { logger } from '../log.ts';

const LEVELS = { error: 'error', warning: 'warn', info: 'debug', debug: 'debug' } as const;

export const workerLogger = new Logger((scope) => (level, message) => {
  // graphile-worker's info lines (worker started, job completed) are routine; keep them at debug.
  logger.log(LEVELS[level], message, { component: 'graphile-worker', job_id: scope.jobId, task: scope.taskIdentifier });
});
