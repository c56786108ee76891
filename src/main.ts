// The `sarsen` command: reads the command line against the table of commands
// (src/cli/commands.ts) and runs the one it names. With none it serves (`sarsen serve`).
import cluster from 'node:cluster';
import { readEnvironment, serveOptions, ConfigError, type Environment } from './config/config.ts';
import { COMMANDS, helpFor, parseInvocation } from './cli/commands.ts';
import { parseHosts } from './core/hosts.ts';
import type { OpenDatabase } from './cli/database.ts';
import type { FlagValues } from './core/flags.ts';
import type { BATCH_FLAGS } from './cli/batch.ts';
import type { EXPORT_FLAGS } from './cli/export.ts';
import { logger, errorFields, configureLogging, writeStdout } from './log.ts';

const out = (line: string) => writeStdout(line + '\n');

type Run = (args: string[], flags: Record<string, string | boolean | undefined>) => Promise<number | void>;
type RunWithDatabase = (db: OpenDatabase, args: string[], flags: Record<string, string | boolean | undefined>, env: Environment) => Promise<number | void>;
// What each command of src/cli/commands.ts does (nothing answered: exit 0); the types give every
// command of the table a line here. Each loads its modules when it runs, so --help answers
// without loading the server.
const STANDALONE: Record<Extract<(typeof COMMANDS)[number], { standalone: true }>['name'], Run> = {
  openapi: async () => out(JSON.stringify((await import('./http/openapi/document.ts')).openApiDocument(), null, 2)),
  help: async (args) => out(helpFor(args)),
  // Clients of a deployment's service routes: no database, no environment of their own.
  'batch run': async (args, flags) => (await import('./cli/batch.ts')).batchCommand(args[0]!, flags as FlagValues<typeof BATCH_FLAGS>, out),
  export: async (_, flags) => (await import('./cli/export.ts')).exportCommand(flags as FlagValues<typeof EXPORT_FLAGS>, out),
};

const WITH_DATABASE: Record<Extract<(typeof COMMANDS)[number], { standalone: false }>['name'], RunWithDatabase> = {
  serve: async (db, _, flags, env) => {
    const embedded = env.database === null;
    const { serve: options, processes } = serveOptions(flags, embedded);
    const { processCount, servePrimary } = await import('./cli/cluster.ts');
    const count = processCount(processes ?? env.processes, env.database && parseHosts(env.database.host, env.database.port));
    return count > 1 ? servePrimary(db, options, count, { embedded }) : (await import('./cli/serve.ts')).serve(db, options, { embedded });
  },
  migrate: async (db) => {
    const pool = (await import('./db/pool.ts')).createPool(db.conn, { max: 2, name: 'sarsen-cli' });
    await (await import('./db/migrate.ts')).migrate(db.conn, pool).finally(() => pool.end());
    out('migrations applied');
  },
  'settings get': async (db, args) => (await import('./cli/settings.ts')).settingsCommand(db, ['get', ...args], out),
  'settings set': async (db, args) => (await import('./cli/settings.ts')).settingsCommand(db, ['set', ...args], out),
  'tenancy create': async (db, args, flags) => (await import('./cli/tenancy.ts')).tenancyCommand(db, ['create', ...args], flags.owner as string, out),
  apply: async (db, args, flags) =>
    (await import('./cli/apply.ts')).applyCommand(db, args, { prune: flags.prune === true, dryRun: flags['dry-run'] === true, credentialPassthrough: flags['credential-passthrough'] === true }, out),
  'credit grant': async (db, args) => (await import('./cli/billing.ts')).billingCommand(db, 'credit', ['grant', ...args], out),
  'prices set': async (db, args) => (await import('./cli/billing.ts')).billingCommand(db, 'prices', ['set', ...args], out),
};

async function main(argv: string[]): Promise<number> {
  const invocation = parseInvocation(argv);
  if ('help' in invocation) {
    out(invocation.help);
    return 0;
  }
  const { command, args, flags } = invocation;
  if (command in STANDALONE) return (await STANDALONE[command as keyof typeof STANDALONE](args, flags)) ?? 0;
  const env = readEnvironment();
  configureLogging({ level: env.logLevel });
  // Tracing (the OTEL_* variables) is for processes that serve; it stays off unless they ask.
  if (env.tracing !== null && command === 'serve') {
    await (await import('./telemetry/setup.ts')).startTracing(env.tracing, typeof flags.role === 'string' ? flags.role : 'both');
  }
  // A worker of `serve --processes N`: its database and secrets come from the primary.
  if (cluster.isWorker) return (await import('./cli/cluster.ts')).serveWorker(serveOptions(flags, env.database === null).serve);
  const db = await (await import('./cli/database.ts')).openDatabase(env);
  try {
    return (await WITH_DATABASE[command as keyof typeof WITH_DATABASE](db, args, flags, env)) ?? 0;
  } finally {
    await db.close();
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  async (err) => {
    // The operator's mistakes are told in a line; anything else is logged with its fields.
    const { SettingError } = await import('./config/settings.ts');
    const { EmbeddedError } = await import('./db/embedded.ts');
    if (err instanceof ConfigError || err instanceof SettingError || err instanceof EmbeddedError) process.stderr.write(`sarsen: ${err.message}\n`);
    else logger.error('sarsen failed', errorFields(err));
    process.exitCode = 1;
  },
);
