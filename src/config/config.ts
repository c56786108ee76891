// Deployment configuration: pointers from the environment (CTX_*), flags from the command line,
// secrets from files. Read once at startup, validated, frozen. No figure the deployment charges
// or enforces comes from here: those are settings in the database (src/config/settings.ts).
import { parseArgs } from 'node:util';
import path from 'node:path';
import { z } from 'zod';
import { LOG_LEVELS, type LogLevel } from '../log.ts';
import { parseHosts, HostListError } from '../core/hosts.ts';
import { minimumConnections } from '../core/connection-budget.ts';

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
  return Object.freeze({ database: database && Object.freeze(database), dataDir, secretsDir, logLevel: e.CTX_LOG_LEVEL, processes: e.CTX_PROCESSES ?? null });
}

const serveSchema = z.object({
  role: z.enum(ROLES),
  credentialPassthrough: z.boolean(),
  port,
  host: nonEmpty,
  executorConcurrency: z.coerce.number().int().min(1).max(100_000),
  databaseConnections: z.coerce.number().int().min(1).max(10_000).optional(),
});

export type ParsedCommand = Readonly<{
  command: string[];
  serve: ServeOptions;
  /** --processes: how many processes serve behind one port (null: CTX_PROCESSES, else the default). */
  processes: number | null;
  owner?: string;
  apply: { prune: boolean; dryRun: boolean };
}>;

const processes = z.coerce.number().int().min(1).max(256);

/** Splits argv into a sub-command (words) and the serve flags. `sarsen` alone means `sarsen serve`. */
export function parseCommandLine(argv: string[], embedded: boolean): ParsedCommand {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      strict: true,
      options: {
        role: { type: 'string', default: 'both' },
        'credential-passthrough': { type: 'boolean', default: false },
        port: { type: 'string', default: '8080' },
        host: { type: 'string' },
        'executor-concurrency': { type: 'string', default: '1024' },
        processes: { type: 'string' },
        'database-connections': { type: 'string' },
        owner: { type: 'string' },
        prune: { type: 'boolean', default: false },
        'dry-run': { type: 'boolean', default: false },
        help: { type: 'boolean', short: 'h', default: false },
      },
    });
  } catch (err) {
    throw new ConfigError((err as Error).message);
  }
  const v = parsed.values;
  const serve = serveSchema.safeParse({
    role: v.role,
    credentialPassthrough: v['credential-passthrough'],
    port: v.port,
    host: v.host ?? (embedded ? '127.0.0.1' : '0.0.0.0'),
    executorConcurrency: v['executor-concurrency'],
    databaseConnections: v['database-connections'],
  });
  if (!serve.success) throw new ConfigError(`Invalid flags: ${formatIssues(serve.error)}`);
  const count = v.processes === undefined ? null : processes.safeParse(v.processes);
  if (count && !count.success) throw new ConfigError(`Invalid flags: processes: ${formatIssues(count.error)}`);
  const { role, databaseConnections } = serve.data;
  if (databaseConnections !== undefined && databaseConnections < minimumConnections(role)) {
    throw new ConfigError(`Invalid flags: --database-connections: a ${role} process needs at least ${minimumConnections(role)}`);
  }
  const command = parsed.positionals.length > 0 ? parsed.positionals : ['serve'];
  if (v.help) command.splice(0, command.length, 'help');
  return Object.freeze({ command, serve: Object.freeze(serve.data), processes: count?.data ?? null, owner: v.owner, apply: { prune: v.prune, dryRun: v['dry-run'] } });
}
