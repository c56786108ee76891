import type { ServeOptions } from '../config/config.ts';
import type { OpenDatabase } from './database.ts';
import { startSarsen } from '../server.ts';
import { configureLogging, logger, errorFields, writeStdout } from '../log.ts';
import { bootstrapEmbedded, firstRunBanner } from './tenancy.ts';

// A terminal's Ctrl-C reaches every process of its group, and `npm start` passes its own copy on
// to Sarsen: one keypress arrives as two signals a few milliseconds apart. Only a signal this
// long after the first is a second request, which forces the exit.
const SAME_SIGNAL_MS = 1000;

/**
 * Runs until SIGTERM or SIGINT, then stops gracefully and exits 0; a second signal (a second
 * later) forces exit. A fault that cannot heal stops it with exit code 1, for the deployment
 * to restart it.
 */
export async function serve(db: OpenDatabase, opts: ServeOptions, mode: { embedded?: boolean } = {}): Promise<number> {
  configureLogging({ role: opts.role });
  // Embedded quick start: the first run creates default/default and its owner before binding.
  const firstRun = mode.embedded ? await bootstrapEmbedded(db.conn) : null;
  const sarsen = await startSarsen({ conn: db.conn, serve: opts, secrets: db.secrets });
  // Printed, not logged: the password must not reach a log collector.
  if (firstRun) writeStdout(firstRunBanner(firstRun, sarsen.url) + '\n');
  let code = 0;
  await new Promise<void>((resolve) => {
    let signalledAt: number | null = null;
    const onSignal = (signal: NodeJS.Signals) => {
      if (signalledAt !== null) {
        if (Date.now() - signalledAt < SAME_SIGNAL_MS) return;
        logger.warn('second signal: exiting at once', { signal });
        process.exit(1);
      }
      signalledAt = Date.now();
      logger.info('shutting down', { signal });
      sarsen
        .stop()
        .catch((err) => logger.error('shutdown failed', errorFields(err)))
        .finally(resolve);
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
    void sarsen.failed.then((reason) => {
      if (signalledAt !== null) return;
      signalledAt = Date.now();
      logger.error(`exiting: ${reason}`);
      code = 1;
      sarsen
        .stop()
        .catch((err) => logger.error('shutdown failed', errorFields(err)))
        .finally(resolve);
    });
  });
  return code;
}
