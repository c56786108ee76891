// Deployment configuration: pointers from the environment (CTX_*, and the standard OTEL_* of tracing), flags from the command line,
// secrets from files. Read once at startup, validated, frozen. No figure the deployment charges
// or enforces comes from here: those are settings in the database (src/config/settings.ts).
import path from 'node:path';
import { z } from 'zod';
import { LOG_LEVELS, type LogLevel } from '../log.ts';
import { parseHosts, HostListError } from '../core/hosts.ts';
import { minimumConnections } from '../core/connection-budget.ts';
import type { Flags, FlagValues } from '../core/flags.ts';

export const ROLES = ['api', 'executor', 'both'] as const;
export type Role = (typeof ROLES)[number];

export type DatabaseTarget = { host: string; port: number; user: string; database: string };

export type ServeOptions = Readonly<{
  role: Role;
  credentialPassthrough: boolean;
  port: number;
  host: string;
  /** Attempts an executor runs at once (the provider calls are I/O-bound: one process holds many). */
  executorConcurrency: number;
  /** The most database connections the process holds (absent: the role's default; docs/scaling.md). */
  databaseConnections?: number;
}>;

export type Environment = Readonly<{
  database: DatabaseTarget | null; // null: embedded PostgreSQL under dataDir
  dataDir: string;
  secretsDir: string;
  logLevel: LogLevel;
  /** CTX_PROCESSES: how many processes `serve` runs when --processes is not given. */
  processes: number | null;
  /** OpenTelemetry tracing from the standard OTEL_* variables; null: off (docs/operations.md "Tracing"). */
  tracing: TracingConfig | null;
}>;

export const SAMPLERS = ['always_on', 'always_off', 'traceidratio', 'parentbased_always_on', 'parentbased_always_off', 'parentbased_traceidratio'] as const;

export type TracingConfig = Readonly<{
  protocol: 'http/protobuf' | 'http/json';
  serviceName: string;
  sampler: (typeof SAMPLERS)[number];
  /** OTEL_TRACES_SAMPLER_ARG: the ratio of the ratio samplers. */
  ratio: number;
  scheduleDelayMs: number;
  exportTimeoutMs: number;
  maxQueueSize: number;
  maxExportBatchSize: number;
}>;

const port = z.coerce.number().int().min(0).max(65535);
const nonEmpty = z.string().trim().min(1);

const envSchema = z.object({
  CTX_DATABASE_HOST: nonEmpty.optional(),
  CTX_DATABASE_PORT: port.default(5432),
  CTX_DATABASE_USER: nonEmpty.default('sarsen'),
  CTX_DATABASE_NAME: nonEmpty.default('sarsen'),
  CTX_SECRETS_DIR: nonEmpty.optional(),
  CTX_DATA_DIR: nonEmpty.default('.sarsen'),
  CTX_LOG_LEVEL: z.enum(LOG_LEVELS).default('info'),
  CTX_PROCESSES: z.coerce.number().int().min(1).max(256).optional(),
});

const count = (fallback: number) => z.coerce.number().int().min(0).default(fallback);
const blank = (v: unknown) => (typeof v === 'string' && v.trim() === '' ? undefined : v);
// The OpenTelemetry variables Sarsen reads itself (the OTLP exporter reads its endpoint, headers,
// timeout and compression from OTEL_EXPORTER_OTLP_* on its own, once, as it starts).
const otelSchema = z.object({
  OTEL_SDK_DISABLED: z.preprocess(blank, z.enum(['true', 'false']).optional()),
  OTEL_TRACES_EXPORTER: z.preprocess(blank, z.enum(['otlp', 'none']).optional()),
  OTEL_EXPORTER_OTLP_ENDPOINT: z.preprocess(blank, z.string().optional()),
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: z.preprocess(blank, z.string().optional()),
  OTEL_EXPORTER_OTLP_PROTOCOL: z.preprocess(blank, z.enum(['http/protobuf', 'http/json']).optional()),
  OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: z.preprocess(blank, z.enum(['http/protobuf', 'http/json']).optional()),
  OTEL_SERVICE_NAME: z.preprocess(blank, nonEmpty.default('sarsen')),
  OTEL_TRACES_SAMPLER: z.preprocess(blank, z.enum(SAMPLERS).default('parentbased_always_on')),
  OTEL_TRACES_SAMPLER_ARG: z.preprocess(blank, z.coerce.number().min(0).max(1).default(1)),
  OTEL_BSP_SCHEDULE_DELAY: z.preprocess(blank, count(5000)),
  OTEL_BSP_EXPORT_TIMEOUT: z.preprocess(blank, count(30000)),
  OTEL_BSP_MAX_QUEUE_SIZE: z.preprocess(blank, count(2048)),
  OTEL_BSP_MAX_EXPORT_BATCH_SIZE: z.preprocess(blank, count(512)),
});

/**
 * Tracing is on when OTEL_TRACES_EXPORTER=otlp, or when an OTLP endpoint is named and the
 * exporter is not `none`; OTEL_SDK_DISABLED=true turns it off whatever else is set
 * (docs/operations.md "Tracing"). Only the OTLP exporters over HTTP are built in.
 */
export function readTracing(env: NodeJS.ProcessEnv = process.env): TracingConfig | null {
  const parsed = otelSchema.safeParse(env);
  if (!parsed.success) throw new ConfigError(`Invalid environment: ${formatIssues(parsed.error)} (Sarsen exports traces with OTLP over HTTP only)`);
  const e = parsed.data;
  if (e.OTEL_SDK_DISABLED === 'true' || e.OTEL_TRACES_EXPORTER === 'none') return null;
  if (e.OTEL_TRACES_EXPORTER !== 'otlp' && !e.OTEL_EXPORTER_OTLP_ENDPOINT && !e.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) return null;
  return Object.freeze({
    protocol: e.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL ?? e.OTEL_EXPORTER_OTLP_PROTOCOL ?? 'http/protobuf',
    serviceName: e.OTEL_SERVICE_NAME,
    sampler: e.OTEL_TRACES_SAMPLER,
    ratio: e.OTEL_TRACES_SAMPLER_ARG,
    scheduleDelayMs: e.OTEL_BSP_SCHEDULE_DELAY,
    exportTimeoutMs: e.OTEL_BSP_EXPORT_TIMEOUT,
    maxQueueSize: e.OTEL_BSP_MAX_QUEUE_SIZE,
    maxExportBatchSize: Math.min(e.OTEL_BSP_MAX_EXPORT_BATCH_SIZE, e.OTEL_BSP_MAX_QUEUE_SIZE),
  });
}

export class ConfigError extends Error {
  override name = 'ConfigError';
}

function formatIssues(error: z.ZodError): string {
  return error.issues.map((i) => `${i.path.join('.') || 'value'}: ${i.message}`).join('; ');
}

export function readEnvironment(env: NodeJS.ProcessEnv = process.env): Environment {
  const parsed = envSchema.safeParse(env);
  if (!parsed.success) throw new ConfigError(`Invalid environment: ${formatIssues(parsed.error)}`);
  const e = parsed.data;
  if (e.CTX_DATABASE_HOST) {
    try {
      parseHosts(e.CTX_DATABASE_HOST, e.CTX_DATABASE_PORT);
    } catch (err) {
      if (err instanceof HostListError) throw new ConfigError(`Invalid environment: CTX_DATABASE_HOST: ${err.message}`);
      throw err;
    }
  }
  const dataDir = path.resolve(e.CTX_DATA_DIR);
  const database = e.CTX_DATABASE_HOST
    ? { host: e.CTX_DATABASE_HOST, port: e.CTX_DATABASE_PORT, user: e.CTX_DATABASE_USER, database: e.CTX_DATABASE_NAME }
    : null;
  // Embedded mode keeps its generated dev secrets beside its data; a real deployment mounts them.
  const secretsDir = path.resolve(e.CTX_SECRETS_DIR ?? (database ? '/run/secrets/sarsen' : path.join(dataDir, 'secrets')));
  return Object.freeze({
    database: database && Object.freeze(database), dataDir, secretsDir, logLevel: e.CTX_LOG_LEVEL, processes: e.CTX_PROCESSES ?? null, tracing: readTracing(env),
  });
}

const serveSchema = z.object({
  role: z.enum(ROLES),
  credentialPassthrough: z.boolean(),
  port,
  host: nonEmpty,
  executorConcurrency: z.coerce.number().int().min(1).max(100_000),
  databaseConnections: z.coerce.number().int().min(1).max(10_000).optional(),
});

/**
 * The flags of `sarsen serve`, for node:util's parseArgs, each with the line its usage shows
 * (`value` names a string flag's argument). src/cli/commands.ts prints them.
 */
export const SERVE_FLAGS = {
  role: { type: 'string', default: 'both', value: 'api|executor|both', help: 'what this process runs: api (the HTTP routes), executor (the provider calls) or both' },
  'credential-passthrough': { type: 'boolean', help: 'lets backends use the caller\'s provider credential (off by default)' },
  port: { type: 'string', default: '8080', value: 'N', help: 'the port to listen on; 0 takes a free one' },
  host: { type: 'string', value: 'H', help: 'the address to listen on (default 127.0.0.1 on embedded PostgreSQL, else 0.0.0.0)' },
  processes: { type: 'string', value: 'N', help: 'processes behind the one port (default CTX_PROCESSES, else 1 where PostgreSQL runs on this machine, one per core where it runs elsewhere)' },
  'executor-concurrency': { type: 'string', default: '1024', value: 'N', help: 'attempts one executor process runs at once' },
  'database-connections': { type: 'string', value: 'N', help: 'the most database connections one process holds (default: by role; docs/scaling.md)' },
} as const satisfies Flags;

export type ServeFlags = Partial<FlagValues<typeof SERVE_FLAGS>>;

const processes = z.coerce.number().int().min(1).max(256);

/**
 * The serve options from its parsed flags. `processes` is --processes (null: CTX_PROCESSES,
 * else the default).
 */
export function serveOptions(flags: ServeFlags, embedded: boolean): { serve: ServeOptions; processes: number | null } {
  const serve = serveSchema.safeParse({
    role: flags.role ?? SERVE_FLAGS.role.default,
    credentialPassthrough: flags['credential-passthrough'] === true,
    port: flags.port ?? SERVE_FLAGS.port.default,
    host: flags.host ?? (embedded ? '127.0.0.1' : '0.0.0.0'),
    executorConcurrency: flags['executor-concurrency'] ?? SERVE_FLAGS['executor-concurrency'].default,
    databaseConnections: flags['database-connections'],
  });
  if (!serve.success) throw new ConfigError(`Invalid flags: ${formatIssues(serve.error)}`);
  const count = flags.processes === undefined ? null : processes.safeParse(flags.processes);
  if (count && !count.success) throw new ConfigError(`Invalid flags: processes: ${formatIssues(count.error)}`);
  const { role, databaseConnections } = serve.data;
  if (databaseConnections !== undefined && databaseConnections < minimumConnections(role)) {
    throw new ConfigError(`Invalid flags: --database-connections: a ${role} process needs at least ${minimumConnections(role)}`);
  }
  return { serve: Object.freeze(serve.data), processes: count?.data ?? null };
}
