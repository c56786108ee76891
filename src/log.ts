// JSON-lines logging. Callers pass identifiers and figures only: never a prompt, an answer,
// a credential or a key secret. Error objects are reduced to name/code/message by `errorFields`.
import winston from 'winston';
import { Writable } from 'node:stream';

// `time` first in every line, as an ISO-8601 UTC string.
const stamp = winston.format((info) => Object.assign(info, { time: new Date().toISOString() }));

const stdoutTransport = new winston.transports.Console({ stderrLevels: [] });

export const logger = winston.createLogger({
  level: 'info',
  format: winston.format.combine(stamp(), winston.format.json()),
  defaultMeta: { role: 'cli' },
  transports: [stdoutTransport],
});

export function configureLogging(opts: { role?: string; level?: string; stdout?: boolean }): void {
  if (opts.role) logger.defaultMeta = { ...logger.defaultMeta, role: opts.role };
  if (opts.level) logger.level = opts.level;
  if (opts.stdout !== undefined) stdoutTransport.silent = !opts.stdout;
}

/** Adds a sink receiving every formatted log line (tests use it to prove what never gets logged). */
export function addLogSink(onLine: (line: string) => void): () => void {
  const transport = new winston.transports.Stream({
    level: 'debug',
    stream: new Writable({
      write(chunk, _enc, done) {
        onLine(String(chunk));
        done();
      },
    }),
  });
  logger.add(transport);
  return () => {
    logger.remove(transport);
  };
}

/** The parts of an error that are safe to log: never its stack's data or a driver's echoed values. */
export function errorFields(err: unknown): Record<string, unknown> {
  if (!(err instanceof Error)) return { error: typeof err };
  const e = err as Error & { code?: unknown };
  return { error: e.name, code: typeof e.code === 'string' ? e.code : undefined, message: e.message, stack: e.stack };
}
