// `sarsen serve --processes N`: N processes of the chosen role behind one port (node:cluster).
// The primary migrates once (when a primary database answers), claims the port, forks the workers, hands them the database and
// secrets over its IPC channel, relays their log lines and serves nothing itself. Each worker
// listens on sockets that share the port (SO_REUSEPORT, src/http/listen.ts): the kernel spreads
// connections over them, and a worker busy with thousands of streams still takes new callers in
// at once, which a primary handing connections over one at a time did not allow
// (docs/operations.md "Processes"). A worker that dies is replaced after a backoff; its leases
// are recovered by the others as after any crash (docs/durability.md "Recovery").
import cluster, { type Worker } from 'node:cluster';
import os from 'node:os';
import type { Readable } from 'node:stream';
import type { ServeOptions } from '../config/config.ts';
import type { Secrets } from '../config/secrets.ts';
import type { ConnectionConfig } from '../db/pool.ts';
import type { OpenDatabase } from './database.ts';
import { createPool } from '../db/pool.ts';
import { startingPoint, migrateWhenWritable } from '../db/startup.ts';
import { configureLogging, logger, errorFields, writeStdout, type LogFormat } from '../log.ts';
import { restartAfter } from '../core/restart-backoff.ts';
import { memoryLimit, workerExecArgv } from '../core/runtime-flags.ts';
import { bootstrapEmbedded, firstRunBanner } from './tenancy.ts';
import { onStopSignals, runUntilStopped } from './serve.ts';
import { canSharePort, claimPort } from '../http/listen.ts';
import { isLocalHost, type HostPort } from '../core/hosts.ts';

/**
 * --processes, else CTX_PROCESSES, else one per core where PostgreSQL runs elsewhere, and one
 * where it shares this machine's cores (`hosts` null: embedded; or every host local): there a
 * second process took cores from PostgreSQL and split its group commits, serving less than one
 * (docs/operations.md "Processes").
 */
export function processCount(given: number | null, hosts: readonly HostPort[] | null): number {
  if (given !== null) return given;
  return hosts === null || hosts.every((h) => isLocalHost(h.host)) ? 1 : os.availableParallelism();
}

type Setup = {
  type: 'sarsen:setup';
  /** The port the primary claimed, for the workers' sockets to share. */
  port: number;
  conn: ConnectionConfig;
  secrets: { credentialKey: string; apiKeyHashKey: string; databasePassword: string; metricsToken?: string };
  log: { format: LogFormat; colour: boolean };
};
type Ready = { type: 'sarsen:ready' };

const setupFor = (db: OpenDatabase, port: number): Setup => ({
  type: 'sarsen:setup',
  port,
  conn: db.conn,
  secrets: {
    credentialKey: db.secrets.credentialKey.toString('base64'),
    apiKeyHashKey: db.secrets.apiKeyHashKey.toString('base64'),
    databasePassword: db.secrets.databasePassword,
    ...(db.secrets.metricsToken === undefined ? {} : { metricsToken: db.secrets.metricsToken }),
  },
  // The workers write through this process's stdout: they format as it would.
  log: { format: process.stdout.isTTY ? 'pretty' : 'json', colour: process.stdout.isTTY === true },
});

/**
 * Writes what `from` prints, whole lines at a time: a line of one worker never lands inside
 * another's, which a shared pipe allows for writes beyond its atomic size.
 */
function relayLines(from: Readable | null, write: (text: string) => void): void {
  if (!from) return;
  let partial = '';
  from.setEncoding('utf8');
  from.on('data', (chunk: string) => {
    const end = chunk.lastIndexOf('\n');
    if (end === -1) {
      partial += chunk;
      return;
    }
    write(partial + chunk.slice(0, end + 1));
    partial = chunk.slice(end + 1);
  });
  from.on('end', () => {
    if (partial) write(partial + '\n');
  });
}

/** The primary: migrates, runs `count` workers until a signal, and answers the exit code. */
export async function servePrimary(db: OpenDatabase, opts: ServeOptions, count: number, mode: { embedded?: boolean } = {}): Promise<number> {
  configureLogging({ role: opts.role, worker: 'primary' });
  let firstRun = null;
  if (mode.embedded) firstRun = await bootstrapEmbedded(db.conn);
  // Migrating once waits for a writable primary. A standby that already has the schema lets
  // the workers start meanwhile: each binds, answers /readyz 503 and waits for the primary itself.
  else if ((await startingPoint(db.conn)) === 'writable') {
    const pool = createPool(db.conn, { max: 2, name: 'sarsen-primary' });
    await migrateWhenWritable(db.conn, pool).finally(() => pool.end());
  }
  // A port that is taken fails here, before any worker starts.
  const { port, url } = await claimPort(opts.port, opts.host);
  if (count > 1 && !(await canSharePort(opts.host))) {
    logger.warn('this platform cannot share a port between processes (SO_REUSEPORT): serving with one', { processes: count });
    count = 1;
  }
  // The workers share the container's memory: each gets its part of the heap the launcher chose.
  const limit = memoryLimit(process.constrainedMemory(), os.totalmem());
  cluster.setupPrimary({ silent: true, execArgv: workerExecArgv(process.execArgv, process.env.SARSEN_RUNTIME_FLAGS ?? '', limit, count) });
  const setup = setupFor(db, port);

  const bornAt = new Map<Worker, number>();
  const timers = new Set<NodeJS.Timeout>();
  let failures = 0;
  let starting = true;
  let stopping = false;
  let code = 0;
  let resolveDone: () => void = () => {};
  const done = new Promise<void>((resolve) => (resolveDone = resolve));
  const live = () => Object.values(cluster.workers ?? {}).filter((w): w is Worker => w !== undefined && !w.isDead());

  const stopAll = (signal: NodeJS.Signals) => {
    stopping = true;
    for (const t of timers) clearTimeout(t);
    timers.clear();
    for (const w of live()) w.process.kill(signal);
    if (live().length === 0) resolveDone();
  };
  const fork = () => {
    const worker = cluster.fork();
    bornAt.set(worker, Date.now());
    relayLines(worker.process.stdout, writeStdout);
    relayLines(worker.process.stderr, (text) => process.stderr.write(text));
    worker.send(setup);
    logger.info('worker started', { worker_id: worker.id, pid: worker.process.pid });
  };

  let ready = 0;
  cluster.on('message', (_worker, message: Ready) => {
    if (message?.type !== 'sarsen:ready') return;
    if (!starting || ++ready < count) return;
    starting = false;
    logger.info('sarsen ready', { url, processes: count });
    // Printed, not logged: the password must not reach a log collector.
    if (firstRun) writeStdout(firstRunBanner(firstRun, url) + '\n');
  });
  cluster.on('exit', (worker, exitCode, signal) => {
    const lived = Date.now() - (bornAt.get(worker) ?? Date.now());
    bornAt.delete(worker);
    const exit = { worker_id: worker.id, pid: worker.process.pid, code: exitCode, signal };
    if (stopping) {
      // Told to stop before it could handle the signal (still starting), it ends by the signal.
      const stoppedBySignal = exitCode === null && (signal === 'SIGTERM' || signal === 'SIGINT');
      if (exitCode !== 0 && !stoppedBySignal) code = 1;
      if (live().length === 0) resolveDone();
      return;
    }
    if (starting) {
      // A worker that cannot start (a port in use, a database refusing it) would fail again.
      logger.error('a worker failed to start: stopping', exit);
      code = 1;
      stopAll('SIGTERM');
      return;
    }
    const next = restartAfter(failures, lived);
    failures = next.failures;
    logger.warn('worker exited: replacing it', { ...exit, after_ms: next.delayMs });
    const timer = setTimeout(() => {
      timers.delete(timer);
      if (!stopping) fork();
    }, next.delayMs);
    timers.add(timer);
  });

  onStopSignals(stopAll, () => {
    for (const w of live()) w.process.kill('SIGKILL');
  });
  for (let i = 0; i < count; i++) fork();
  await done;
  cluster.removeAllListeners('message');
  cluster.removeAllListeners('exit');
  logger.info('sarsen stopped', { processes: count });
  return code;
}

/** A worker: waits for the primary's setup, serves until told to stop, and exits. */
export async function serveWorker(opts: ServeOptions): Promise<never> {
  let code = 1;
  try {
    const setup = await new Promise<Setup>((resolve) => {
      const onMessage = (m: Setup) => {
        if (m?.type !== 'sarsen:setup') return;
        process.off('message', onMessage);
        resolve(m);
      };
      process.on('message', onMessage);
    });
    configureLogging({ role: opts.role, worker: cluster.worker!.id, format: setup.log.format, colour: setup.log.colour });
    const s = setup.secrets;
    const secrets: Secrets = Object.freeze({
      credentialKey: Buffer.from(s.credentialKey, 'base64'),
      apiKeyHashKey: Buffer.from(s.apiKeyHashKey, 'base64'),
      databasePassword: s.databasePassword,
      ...(s.metricsToken === undefined ? {} : { metricsToken: s.metricsToken }),
    });
    // Loaded here, not at the top: the primary never serves, and holds less without it.
    const { startSarsen } = await import('../server.ts');
    const sarsen = await startSarsen({ conn: setup.conn, serve: { ...opts, port: setup.port }, secrets, joinsPort: true });
    process.send!({ type: 'sarsen:ready' } satisfies Ready);
    code = await runUntilStopped(sarsen);
  } catch (err) {
    logger.error('sarsen failed', errorFields(err));
  }
  // The IPC channel would keep the process alive; what is left to log is written on exit.
  process.exit(code);
}
