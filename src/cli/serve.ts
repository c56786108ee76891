import type { ServeOptions } from '../config/config.ts';
import type { OpenDatabase } from './database.ts';
import { startSarsen } from '../server.ts';
import { configureLogging, logger, errorFields } from '../log.ts';
import { bootstrapEmbedded, firstRunBanner } from './tenancy.ts';

/** Runs until SIGTERM or SIGINT, then stops gracefully and exits 0; a second signal forces exit. */
export async function serve(db: OpenDatabase, opts: ServeOptions, mode: { embedded?: boolean } = {}): Promise<void> {
  configureLogging({ role: opts.role });
  // Embedded quick start: the first run creates default/default and its owner before binding.
  const firstRun = mode.embedded ? await bootstrapEmbedded(db.conn) : null;
  const sarsen = await startSarsen({ conn: db.conn, serve: opts, secrets: db.secrets });
  // Printed, not logged: the password must not reach a log collector.
  if (firstRun) process.stdout.write(firstRunBanner(firstRun, sarsen.url) + '\n');
  await new Promise<void>((resolve) => {
    let signalled = false;
    const onSignal = (signal: NodeJS.Signals) => {
      if (signalled) {
        logger.warn('second signal: exiting at once', { signal });
        process.exit(1);
      }
      signalled = true;
      logger.info('shutting down', { signal });
      sarsen
        .stop()
        .catch((err) => logger.error('shutdown failed', errorFields(err)))
        .finally(resolve);
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
  });
}
