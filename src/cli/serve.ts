import type { ServeOptions } from '../config/config.ts';
import type { OpenDatabase } from './database.ts';
import { startSarsen } from '../server.ts';
import { configureLogging, logger, errorFields } from '../log.ts';

/** Runs until SIGTERM or SIGINT, then stops gracefully and exits 0; a second signal forces exit. */
export async function serve(db: OpenDatabase, opts: ServeOptions): Promise<void> {
  configureLogging({ role: opts.role });
  const sarsen = await startSarsen({ conn: db.conn, serve: opts, secrets: db.secrets });
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
