// Composition root: one Sarsen process with the parts its role asks for. Tests start it
// in-process through the same function the command line uses.
import http from 'node:http';
import express, { type Express } from 'express';
import type { ServeOptions } from './config/config.ts';
import type { Secrets } from './config/secrets.ts';
import { createPool, processConnections, openConnections, followDeadline, type ConnectionConfig, type Pool } from './db/pool.ts';
import { startingPoint, migrateWhenWritable } from './db/startup.ts';
import { connectionBudget } from './core/connection-budget.ts';
import { migrationsApplied, schemaMissing } from './db/migrate.ts';
import { createBus, type Bus } from './bus/bus.ts';
import { createSettingsCache, type SettingsCache } from './config/settings.ts';
import { createApp } from './http/app.ts';
import { trackConnections } from './http/drain.ts';
import { listenShared, type Listening } from './http/listen.ts';
import { answerClientErrors } from './http/client-error.ts';
import { logger, errorFields } from './log.ts';
import { createKeyring } from './core/sealing.ts';
import type { BaseDeps, Deps } from './deps.ts';
import { apiRouters } from './http/routes.ts';
import { closeRouting } from './control/resolve-model.ts';
import { startExecutor, type Executor } from './executor/worker.ts';
import { startBatchDispatcher } from './executor/batch-dispatch.ts';
import { createLiveness } from './db/liveness.ts';
import { newId } from './core/ids.ts';
import { ServiceError } from './core/errors.ts';
import { createSubmitter } from './http/service/submitter.ts';
import { countLiveRequests } from './db/requests.ts';
import { registerPool, registerRequestStates, registerConnections } from './metrics/metrics.ts';
import { openApiDocument } from './http/openapi/document.ts';

export type SarsenOptions = Readonly<{
  conn: ConnectionConfig;
  serve: ServeOptions;
  secrets: Secrets;
  /** A worker of `--processes`: its sockets join the port its primary claimed (`serve.port`). */
  joinsPort?: boolean;
}>;

export type Sarsen = {
  url: string; // http://host:port of the bound listener
  /** The express application (tests walk its router). */
  app: Express;
  pool: Pool;
  bus: Bus;
  settings: SettingsCache;
  /** The HTTP connections open now. */
  httpConnections(): number;
  /** Graceful stop: refuse new work, let in-flight requests finish within the grace, release everything. */
  stop(): Promise<void>;
  /** Resolves, with the reason, if a fault occurs that waiting cannot heal (the schema is gone). */
  failed: Promise<string>;
};

// How often a process checks that its schema is still there: a rare fault, found within a
// restart's time, for one statement a process every so often (docs/scaling.md "An idle process").
const SCHEMA_CHECK_MS = 30_000;

export async function startSarsen(opts: SarsenOptions): Promise<Sarsen> {
  // One id names this process: the origin of the events it NOTIFYs, the owner of its leases
  // when it executes, and its connections in pg_stat_activity (`sarsen-<purpose> <id>`).
  const processId = newId('wrk');
  // Every connection the process opens is drawn from one budget (docs/scaling.md).
  const budget = connectionBudget(opts.serve.role, opts.serve.databaseConnections);
  const conn = processConnections(opts.conn, processId, budget);
  const pool = createPool(conn, { purpose: 'main' });
  const { total: _, ...byPurpose } = budget;
  const cleanups: (() => Promise<void> | void)[] = [
    () => pool.end(),
    registerPool('main', pool),
    registerRequestStates(() => countLiveRequests(pool)),
    registerConnections(() => openConnections(conn), byPurpose),
  ];
  const unwind = async () => {
    for (const fn of cleanups.reverse()) await Promise.resolve(fn()).catch((err) => logger.warn('cleanup failed', errorFields(err)));
  };
  try {
    // One server for the process's life: it answers as `waiting` until the app is built.
    let handle: http.RequestListener = waiting(opts.secrets.metricsToken ?? null);
    const server = http.createServer({ keepAliveTimeout: 65_000 }, (req, res) => handle(req, res));
    const connections = trackConnections(server);
    answerClientErrors(server);
    let listening: Listening | null = null;
    let app: Express | null = null;
    const bind = async () => {
      const bound = await listenShared(server, opts.serve.port, opts.serve.host, { joins: opts.joinsPort === true });
      cleanups.push(() => bound.close());
      logger.info('sarsen listening', { url: bound.url, role: opts.serve.role, process_id: processId, ...(handle === app ? {} : { ready: false }) });
      return bound;
    };
    // Schema first: nothing binds before the database is at the version this code expects.
    // Started while only a standby answers, a process waits for a writable primary; if the
    // standby already has the schema, it binds meanwhile (docs/scaling.md "Starting during a failover").
    if ((await startingPoint(conn)) === 'standby') listening = await bind();
    await migrateWhenWritable(conn, pool);
    // An executor's liveness lock lives on the bus connection: if the process dies, the lock
    // goes with its session and the watching executor sees within a check that its leases are
    // orphaned (src/db/liveness.ts).
    const executes = opts.serve.role !== 'api';
    const liveness = executes ? createLiveness(processId) : null;
    const bus = createBus(conn, {
      origin: processId,
      follows: opts.serve.role !== 'executor',
      executes,
      ...(liveness ? { onConnect: (client) => liveness.onConnect(client) } : {}),
    });
    cleanups.push(() => bus.close());
    await bus.ready();
    const settings = await createSettingsCache(pool, bus);
    cleanups.push(() => settings.close());
    // Every round trip of the process is bounded by the setting from here on (before: its default).
    followDeadline(conn, () => settings.current().database_deadline_ms);

    const base: BaseDeps = Object.freeze({
      processId,
      conn,
      pool,
      bus,
      settings,
      secrets: opts.secrets,
      serve: opts.serve,
      keyring: createKeyring([{ version: 1, secret: opts.secrets.credentialKey }]),
    });
    // Acceptance and the batch dispatcher share the routing cache; dropped once both have stopped.
    cleanups.push(() => closeRouting(base));
    const executor: Executor | null = liveness ? await startExecutor(base, conn, { concurrency: opts.serve.executorConcurrency, liveness }) : null;
    if (executor) cleanups.push(() => executor.stop(0));
    // Batch lines reach the queue through the dispatcher of some executor (docs/api.md "Batches").
    const batches = executor ? startBatchDispatcher(base) : null;
    if (batches) cleanups.push(() => batches.stop());
    // Where execution starts: a process that also executes claims what it accepts, in the
    // acceptance commit while it has a free slot, and its executor starts the provider call
    // right after that commit (docs/durability.md "Run where accepted"). Otherwise jobs carry it.
    const runWhereAccepted = executor?.runWhereAccepted ?? null;
    const deps: Deps = Object.freeze({ ...base, submitter: createSubmitter(conn, pool, settings, runWhereAccepted) });
    cleanups.push(() => deps.submitter.close());
    const api = opts.serve.role === 'executor' ? { routers: [], close: async () => {} } : apiRouters(deps);
    cleanups.push(() => api.close());
    app = createApp({
      routers: api.routers,
      metricsToken: opts.secrets.metricsToken ?? null,
      ...(opts.serve.role === 'executor' ? {} : { openapi: openApiDocument }),
      // Its query also proves the database answers (a refused connection answers 503).
      ready: () => migrationsApplied(pool),
    });
    handle = app;
    if (listening) logger.info('sarsen ready: a writable primary answers', { url: listening.url, process_id: processId });
    else listening = await bind();
    const { url } = listening;

    // Every other fault heals by waiting; a missing schema does not (a restart migrates it again).
    const failed = new Promise<string>((resolve) => {
      const check = setInterval(() => {
        void schemaMissing(pool).then((missing) => {
          if (!missing) return;
          clearInterval(check);
          resolve('the database answers but Sarsen\'s schema is missing; restart Sarsen to apply the migrations again');
        });
      }, SCHEMA_CHECK_MS);
      check.unref();
      cleanups.push(() => clearInterval(check));
    });

    let stopping: Promise<void> | null = null;
    const stop = () =>
      (stopping ??= (async () => {
        const grace = settings.current().shutdown_grace_ms;
        // HTTP waiters and the executions they wait on finish together within one grace.
        listening!.close();
        await Promise.all([connections.drain(grace), executor?.stop(grace)]);
        await unwind();
        logger.info('sarsen stopped');
      })());
    return { url, app, pool, bus, settings, httpConnections: connections.open, stop, failed };
  } catch (err) {
    await unwind();
    throw err;
  }
}

/**
 * What a process answers while it waits for a writable primary: alive (/healthz), not ready
 * (/readyz 503), its metrics, and 503 with Retry-After to everything else.
 */
function waiting(metricsToken: string | null): Express {
  const refuse = express.Router().use(() => {
    throw new ServiceError('unavailable', undefined, { retryAfterSeconds: 1 });
  });
  return createApp({ ready: async () => false, metricsToken, routers: [refuse] });
}
