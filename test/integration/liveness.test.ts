// The watcher's look for dead executors (src/db/liveness.ts), on a real database: a listed
// executor whose liveness lock is free is dead, except while the watcher's own bus has just
// connected again. After a failover every lock is gone with the old primary, and a promoted
// standby keeps its postmaster's start time, so the reconnect is what tells the watcher to wait
// for the live executors' buses to come back.
import { expect } from 'chai';
import { EventEmitter } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { run, type WorkerEvents } from 'graphile-worker';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';
import { createLiveness, watchExecutors } from '../../src/db/liveness.ts';
import { RESTART_GRACE_MS } from '../../src/db/recovery.ts';
import { until } from '../support/http.ts';
import { EXECUTE_REQUEST } from '../../src/db/jobs.ts';
import { queueOptions, superviseQueue } from '../../src/executor/worker.ts';
import { connectionFailed } from '../../src/db/pool.ts';

describe('liveness: the watcher after its bus reconnects', function () {
  this.timeout(60_000);
  let db: TestDatabase;
  let pool: ReturnType<typeof testPool>;
  const sessions: pg.Client[] = [];

  const session = async () => {
    const client = new pg.Client(db.conn);
    client.on('error', () => undefined);
    await client.connect();
    sessions.push(client);
    return client;
  };

  before(async () => {
    db = await createTestDatabase();
    pool = testPool(db.conn, 2);
    // Nobody is taken for dead within the grace after the postmaster started, and an embedded
    // server started for this run may be younger than that: wait it out.
    await until(async () => {
      const { rows } = await pool.query<{ old: boolean }>(
        `SELECT pg_postmaster_start_time() < now() - make_interval(secs => $1::double precision / 1000) AS old`,
        [RESTART_GRACE_MS],
      );
      return rows[0]!.old || undefined;
    }, 10 * RESTART_GRACE_MS, 100);
  });
  after(async () => {
    for (const s of sessions) await s.end().catch(() => undefined);
    await pool?.end();
    await db?.drop();
  });

  it('takes an executor whose lock is free for dead, but nobody while its own bus has just reconnected', async () => {
    const watcher = createLiveness('wrk_watcher');
    const first = await session();
    await watcher.onConnect(first);
    expect(watcher.settling(), 'a first connection is no reconnect').to.equal(false);
    // An executor that was listed and whose session is gone: nothing holds its lock.
    await pool.query(`INSERT INTO sarsen.executors (process_id) VALUES ('wrk_gone')`);
    // One that lives: its lock is held on a session of its own.
    const live = createLiveness('wrk_live');
    await live.onConnect(await session());
    expect((await watchExecutors(pool, watcher.owner, watcher.settling())).dead).to.deep.equal(['wrk_gone']);

    // The watcher's bus loses its connection and connects again, as it does through a failover.
    await first.end();
    await watcher.onConnect(await session());
    expect(watcher.settling()).to.equal(true);
    expect((await watchExecutors(pool, watcher.owner, watcher.settling())).dead, 'while settling').to.deep.equal([]);

    // The grace passes: a lock still free then is a dead executor's.
    while (watcher.settling()) await new Promise((r) => setTimeout(r, 100));
    expect((await watchExecutors(pool, watcher.owner, watcher.settling())).dead).to.deep.equal(['wrk_gone']);
  });

  it('lists again on a reconnect only the job pools not dropped', async () => {
    const liveness = createLiveness('wrk_dropping');
    const listed = async () =>
      (await pool.query<{ job_pools: string[] }>(`SELECT job_pools FROM sarsen.executors WHERE process_id = 'wrk_dropping'`)).rows[0]!.job_pools;
    const first = await session();
    await liveness.onConnect(first);
    await liveness.addJobPool(pool, 'pool-old');
    await liveness.addJobPool(pool, 'pool-new');
    await liveness.dropJobPool(pool, 'pool-old');
    expect(await listed()).to.deep.equal(['pool-new']);
    // The bus loses its session and connects again: it lists the process afresh, from memory.
    await first.end();
    await liveness.onConnect(await session());
    expect(await listed()).to.deep.equal(['pool-new']);
  });
});

describe('liveness: a job pool is listed before it locks a job', function () {
  this.timeout(60_000);
  let db: TestDatabase;
  let pool: ReturnType<typeof testPool>;
  let queuePool: ReturnType<typeof testPool>;
  const sessions: pg.Client[] = [];

  before(async () => {
    db = await createTestDatabase();
    pool = testPool(db.conn, 4);
    queuePool = testPool(db.conn, 3);
  });
  after(async () => {
    for (const s of sessions) await s.end().catch(() => undefined);
    await queuePool?.end();
    await pool?.end();
    await db?.drop();
  });

  it('holds the new pool\'s first fetch while its listing waits, so the job it then runs is locked by a listed pool', async () => {
    const owner = 'wrk_pools';
    const liveness = createLiveness(owner);
    const bus = new pg.Client(db.conn);
    bus.on('error', () => undefined);
    await bus.connect();
    sessions.push(bus);
    await liveness.onConnect(bus);
    // A job due now, waiting before the pool exists.
    await pool.query(`SELECT graphile_worker.add_job($1, json_build_object('request_id', 'req_listed'), job_key := 'req_listed')`, [EXECUTE_REQUEST]);

    // Hold the process's row, so the listing's UPDATE waits behind this transaction.
    const holder = new pg.Client(db.conn);
    await holder.connect();
    sessions.push(holder);
    await holder.query('BEGIN');
    await holder.query('SELECT 1 FROM sarsen.executors WHERE process_id = $1 FOR UPDATE', [owner]);

    const ran: { lockedBy: string; listed: string[] }[] = [];
    const queue = await superviseQueue(
      (events: WorkerEvents) =>
        run({
          ...queueOptions(1),
          pgPool: queuePool,
          events,
          taskList: {
            [EXECUTE_REQUEST]: async (_payload, helpers) => {
              const { rows } = await pool.query<{ job_pools: string[] }>('SELECT job_pools FROM sarsen.executors WHERE process_id = $1', [owner]);
              ran.push({ lockedBy: String(helpers.job.locked_by), listed: rows[0]!.job_pools });
            },
          },
        }),
      queuePool,
      {
        add: (id) => liveness.addJobPool(pool, id).catch((err) => connectionFailed('test: listing failed', err)),
        drop: async () => undefined,
      },
    );
    try {
      // The listing is under way and blocked...
      await until(async () => {
        const { rows } = await pool.query(
          `SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'UPDATE sarsen.executors%'`,
        );
        return rows.length > 0 ? true : undefined;
      }, 30_000);
      // ...and stays so for a while, in which an unheld pool would have fetched and locked the job.
      await sleep(500);
      const locked = await pool.query(`SELECT locked_by FROM graphile_worker._private_jobs WHERE locked_by IS NOT NULL`);
      expect(locked.rows, 'no job locked before its pool is listed').to.deep.equal([]);
      expect(ran).to.deep.equal([]);

      await holder.query('COMMIT');
      await until(async () => (ran.length > 0 ? true : undefined), 30_000);
      expect(ran).to.have.length(1);
      expect(ran[0]!.listed, 'the pool that locked the job was listed when it ran').to.include(ran[0]!.lockedBy);
    } finally {
      await holder.query('ROLLBACK').catch(() => undefined);
      await queue.stop();
    }
  });
});
