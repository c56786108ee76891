// Logging. JSON lines when stdout is not a terminal (a log collector reads them), a compact
// readable line on a terminal; the level from CTX_LOG_LEVEL. Callers pass identifiers and
// figures only: never a prompt, an answer, a credential or a key secret. Error objects are
// reduced to name/code/message by `errorFields`.
import fs from 'node:fs';
import winston from 'winston';
import TransportStream from 'winston-transport';
import { inspect } from 'node:util';

export const LOG_LEVELS = ['error', 'warn', 'info', 'debug'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];
export type LogFormat = 'json' | 'pretty';

// The trace and span of the current context, when tracing is on (src/telemetry/setup.ts sets it):
// every line written inside a traced request carries them, as `trace_id` and `span_id`.
let correlation: (() => { trace_id: string; span_id: string } | undefined) | null = null;

export function correlateLogLines(fields: typeof correlation): void {
  correlation = fields;
}

// `time` first in every line, as an ISO-8601 UTC string.
const stamp = winston.format((info) => {
  Object.assign(info, { time: new Date().toISOString() });
  return correlation === null ? info : Object.assign(info, correlation());
});

const MESSAGE_SYMBOL = Symbol.for('message');
const COLOURS: Record<string, string> = { error: '\x1b[31m', warn: '\x1b[33m', info: '\x1b[36m', debug: '\x1b[2m' };
// Fields every line carries, or that the line's own layout already shows.
const QUIET = new Set(['level', 'message', 'time', 'role', 'stack']);

function fieldText(v: unknown): string {
  if (typeof v === 'string') return /^[^\s"=]+$/.test(v) ? v : JSON.stringify(v);
  return typeof v === 'object' && v !== null ? JSON.stringify(v) : String(v);
}

/** One compact line for a person: `12:00:01.234 info  message key=value ...`, the stack (if any) below. */
export function prettyLine(info: Record<string, unknown>, colour: boolean): string {
  const level = String(info.level);
  const time = typeof info.time === 'string' ? info.time.slice(11, 23) : '';
  const tag = colour ? `${COLOURS[level] ?? ''}${level.padEnd(5)}\x1b[0m` : level.padEnd(5);
  const fields = Object.entries(info)
    .filter(([k, v]) => !QUIET.has(k) && v !== undefined)
    .map(([k, v]) => `${k}=${fieldText(v)}`);
  const line = [time, tag, typeof info.message === 'string' ? info.message : inspect(info.message), ...fields].join(' ');
  return typeof info.stack === 'string' ? `${line}\n${info.stack.replace(/^/gm, '    ')}` : line;
}

// A cluster worker writes through its primary's stdout, so it is told whether that is a terminal.
let colourLines: boolean | null = null;
const pretty = winston.format((info) => {
  (info as unknown as Record<symbol, string>)[MESSAGE_SYMBOL] = prettyLine(info as Record<string, unknown>, colourLines ?? process.stdout.isTTY === true);
  return info;
});

// Stdout is written at most every FLUSH_MS, with everything logged since (sooner once FLUSH_BYTES
// are pending): a write per line, or per turn of the loop, is a write per request
// (docs/decisions.md "Log lines are batched"). What is pending at exit is written before the
// process goes.
const FLUSH_MS = 25;
const FLUSH_BYTES = 64 * 1024;
let pending: string[] = [];
let pendingBytes = 0;
let timer: NodeJS.Timeout | null = null;
const flushStdout = () => {
  if (timer) clearTimeout(timer);
  timer = null;
  const text = pending.join('');
  pending = [];
  pendingBytes = 0;
  if (text) process.stdout.write(text);
};
process.on('exit', () => {
  if (pending.length > 0) fs.writeSync(1, pending.join(''));
  pending = [];
});

/** Writes `text` to stdout in order with the log lines (within FLUSH_MS). */
export function writeStdout(text: string): void {
  pending.push(text);
  pendingBytes += text.length;
  if (pendingBytes >= FLUSH_BYTES) flushStdout();
  else if (!timer) timer = setTimeout(flushStdout, FLUSH_MS).unref();
}

/**
 * A transport that hands each formatted line to `write` and nothing more: winston's own Stream
 * transport adds a Node stream and a setImmediate per line (docs/decisions.md "Log lines are batched").
 */
function lineTransport(write: (line: string) => void, opts: { level?: LogLevel; format?: winston.Logform.Format } = {}): TransportStream {
  return new TransportStream({
    ...opts,
    log(info: Record<string | symbol, unknown>, next: () => void) {
      write(`${String(info[MESSAGE_SYMBOL])}\n`);
      next();
    },
  });
}

const stdoutTransport = lineTransport(writeStdout);

export const logger = winston.createLogger({
  level: 'info',
  format: stamp(),
  defaultMeta: { role: 'cli' },
  transports: [stdoutTransport],
});

function useFormat(format: LogFormat): void {
  stdoutTransport.format = format === 'pretty' ? pretty() : winston.format.json();
}
useFormat(process.stdout.isTTY ? 'pretty' : 'json');

export function configureLogging(opts: { role?: string; worker?: number | 'primary'; level?: LogLevel; stdout?: boolean; format?: LogFormat; colour?: boolean }): void {
  if (opts.role) logger.defaultMeta = { ...logger.defaultMeta, role: opts.role };
  if (opts.worker !== undefined) logger.defaultMeta = { ...logger.defaultMeta, worker: opts.worker };
  if (opts.colour !== undefined) colourLines = opts.colour;
  if (opts.level) logger.level = opts.level;
  if (opts.stdout !== undefined) stdoutTransport.silent = !opts.stdout;
  if (opts.format) useFormat(opts.format);
}

/** Adds a sink receiving every log line as JSON (tests use it to prove what never gets logged). */
export function addLogSink(onLine: (line: string) => void): () => void {
  const transport = lineTransport(onLine, { level: 'debug', format: winston.format.json() });
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
