// The `sarsen` command. With no sub-command it serves (`sarsen serve`).
import { readEnvironment, parseCommandLine, ConfigError } from './config/config.ts';
import { SettingError } from './config/settings.ts';
import { openDatabase } from './cli/database.ts';
import cluster from 'node:cluster';
import { serve } from './cli/serve.ts';
import { processCount, servePrimary, serveWorker } from './cli/cluster.ts';
import { settingsCommand } from './cli/settings.ts';
import { tenancyCommand } from './cli/tenancy.ts';
import { billingCommand } from './cli/billing.ts';
import { applyCommand } from './cli/apply.ts';
import { batchCommand } from './cli/batch.ts';
import { exportCommand } from './cli/export.ts';
import { createPool } from './db/pool.ts';
import { migrate } from './db/migrate.ts';
import { logger, errorFields, configureLogging, writeStdout } from './log.ts';
import { openApiDocument } from './http/openapi/document.ts';
import { EmbeddedError } from './db/embedded.ts';

const USAGE = `usage:
  sarsen [serve] [--role api|executor|both] [--credential-passthrough] [--port N] [--host H]
        [--processes N]   (processes behind one port; default: one per core, 1 on embedded PostgreSQL)
        [--executor-concurrency N] [--database-connections N]
  sarsen migrate
  sarsen openapi                          (prints the OpenAPI 3.1 document)
  sarsen settings get [NAME]
  sarsen settings set NAME VALUE
  sarsen tenancy create SLUG --owner EMAIL
  sarsen apply FILE [--prune] [--dry-run]  (namespaces, backends, routing rules, API keys as code)
  sarsen credit grant TENANCY MICRO_CREDITS
  sarsen prices set MODEL PROMPT_PER_MTOK COMPLETION_PER_MTOK   (micro-credits per million tokens)
  sarsen batch run INPUT.jsonl --base-url URL --key-file FILE --out RESULTS.jsonl
        [--dialect chat|messages|responses] [--concurrency N] [--skip-invalid]   (an HTTP client: no database)
  sarsen export --tenancy T --namespace N --out FILE.jsonl[.gz] [--since S] [--until U] [--with-payloads]
        [--url URL] [--key-file FILE]      (an HTTP client; key with the manage grant, or SARSEN_API_KEY)
environment: CTX_DATABASE_HOST, CTX_DATABASE_PORT, CTX_DATABASE_USER, CTX_DATABASE_NAME,
             CTX_SECRETS_DIR, CTX_DATA_DIR, CTX_LOG_LEVEL, CTX_PROCESSES (see .env.example)`;

const out = (line: string) => writeStdout(line + '\n');

async function main(argv: string[]): Promise<number> {
  // A client of a deployment's service routes: no database, no environment of its own.
  if (argv[0] === 'batch') return batchCommand(argv.slice(1), out);
  if (argv[0] === 'export') return exportCommand(argv.slice(1), out);
  const env = readEnvironment();
  configureLogging({ level: env.logLevel });
  const { command, serve: serveOptions, processes, owner, apply } = parseCommandLine(argv, env.database === null);
  // A worker of `serve --processes N`: its database and secrets come from the primary.
  if (cluster.isWorker) return serveWorker(serveOptions);
  const [name, ...args] = command;
  if (name === 'help') {
    out(USAGE);
    return 0;
  }
  if (name === 'openapi') {
    out(JSON.stringify(openApiDocument(), null, 2));
    return 0;
  }
  if (!['serve', 'migrate', 'settings', 'tenancy', 'credit', 'prices', 'apply'].includes(name!)) throw new ConfigError(`Unknown command ${JSON.stringify(name)}.\n${USAGE}`);
  const db = await openDatabase(env);
  let code = 0;
  try {
    if (name === 'serve') {
      const embedded = env.database === null;
      const count = processCount(processes ?? env.processes, embedded);
      code = count > 1 ? await servePrimary(db, serveOptions, count, { embedded }) : await serve(db, serveOptions, { embedded });
    }
    else if (name === 'migrate') {
      const pool = createPool(db.conn, { max: 2, name: 'sarsen-cli' });
      await migrate(db.conn, pool).finally(() => pool.end());
      out('migrations applied');
    } else if (name === 'tenancy') await tenancyCommand(db, args, owner, out);
    else if (name === 'credit' || name === 'prices') await billingCommand(db, name, args, out);
    else if (name === 'apply') await applyCommand(db, args, { ...apply, credentialPassthrough: serveOptions.credentialPassthrough }, out);
    else await settingsCommand(db, args, out);
  } finally {
    await db.close();
  }
  return code;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err) => {
    if (err instanceof ConfigError || err instanceof SettingError || err instanceof EmbeddedError) process.stderr.write(`sarsen: ${err.message}\n`);
    else logger.error('sarsen failed', errorFields(err));
    process.exitCode = 1;
  },
);
