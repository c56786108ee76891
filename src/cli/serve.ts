import type { ServeOptions } from '../config/config.ts';
import type { OpenDatabase } from './database.ts';
import type { Sarsen } from '../server.ts';
import { configureLogging, logger, errorFields, writeStdout } from '../log.ts';
import { bootstrapEmbedded, firstRunBanner } from './tenancy.ts';
import { startIdleCollector } from '../idle-collector.ts';
import { flushTracing } from '../telemetry/tracing.ts';

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
  const { startSarsen } = await import('../server.ts');
  const sarsen = await startSarsen({ conn: db.conn, serve: opts, secrets: db.secrets });
  // Printed, not logged: the password must not reach a log collector.
  if (firstRun) writeStdout(firstRunBanner(firstRun, sarsen.url) + '\n');
  return runUntilStopped(sarsen);
}

/** Serves until a signal (exit code 0) or a fault that cannot heal (1); stops `sarsen` either way. */
export function runUntilStopped(sarsen: Sarsen): Promise<number> {
  // A quiet process gives back what a burst left behind (src/idle-collector.ts).
  const collector = startIdleCollector(sarsen.httpConnections);
  return new Promise<number>((resolve) => {
    let code = 0;
    const stop = () => {
      sarsen
        .stop()
        .catch((err) => logger.error('shutdown failed', errorFields(err)))
        // What the process traced leaves before it exits.
        .finally(() => flushTracing())
        .finally(() => {
          collector.stop();
          resolve(code);
        });
    };
    const signals = onStopSignals(stop);
    void sarsen.failed.then((reason) => {
      if (!signals.stopAsIfSignalled()) return;
      logger.error(`exiting: ${reason}`);
      code = 1;
      stop();
    });
  });
}

/**
 * Calls `stop` on the first SIGTERM or SIGINT. Another signal at least a second later exits at
 * once with code 1, after `beforeForcedExit`. `stopAsIfSignalled` answers false when a signal
 * came first, and otherwise makes the next signal the second.
 */
export function onStopSignals(stop: (signal: NodeJS.Signals) => void, beforeForcedExit: () => void = () => {}): { stopAsIfSignalled(): boolean } {
  let signalledAt: number | null = null;
  const onSignal = (signal: NodeJS.Signals) => {
    if (signalledAt !== null) {
      if (Date.now() - signalledAt < SAME_SIGNAL_MS) return;
      logger.warn('second signal: exiting at once', { signal });
      beforeForcedExit();
      process.exit(1);
    }
    signalledAt = Date.now();
    logger.info('shutting down', { signal });
    stop(signal);
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
  return {
    stopAsIfSignalled() {
      if (signalledAt !== null) return false;
      signalledAt = Date.now();
      return true;
    },
  };
}
