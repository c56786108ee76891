// The executor's job queue (src/executor/worker.ts superviseQueue) when graphile-worker shuts a
// worker pool down by itself, as it does when a job's completion fails during a database
// outage. Such a pool drains: it takes no new job until its running jobs end, and those are
// provider calls that may last minutes. And a pool whose batched completion failed once never
// settles its runner (graphile/worker#636). The queue must take jobs again at once all the same,
// and free what the old pool left locked once its jobs ended.
import { expect } from 'chai';
import type pg from 'pg';
import { run, type WorkerEvents } from 'graphile-worker';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';
import { until } from '../support/http.ts';
import { onListening } from '../support/job-pools.ts';
import { EXECUTE_REQUEST } from '../../src/db/jobs.ts';
import { queueOptions, superviseQueue, type JobQueue } from '../../src/executor/worker.ts';

describe('job queue: a worker pool graphile-worker shuts down is replaced at once', function () {
  this.timeout(60_000);
  let db: TestDatabase;
  let pool: pg.Pool;
  let queuePool: pg.Pool;
  let queue: JobQueue | null = null;
  // The release of each job the test holds running, by key.
  const holds = new Map<string, () => void>();

  before(async () => {
    db = await createTestDatabase();
    pool = testPool(db.conn, 2);
    queuePool = testPool(db.conn, 3);
  });
  after(async () => {
    // A failed run leaves jobs held; the queue stops only once they end.
    for (const release of holds.values()) release();
    await queue?.stop();
    await queuePool?.end();
    await pool?.end();
    await db?.drop();
  });

  const addJob = (key: string) =>
    pool.query(`SELECT graphile_worker.add_job($1, json_build_object('request_id', $2::text), job_key := $2)`, [EXECUTE_REQUEST, key]);
  const lockedJobs = async () =>
    (await pool.query<{ key: string; locked_by: string | null }>(`SELECT key, locked_by FROM graphile_worker._private_jobs ORDER BY key`)).rows;

  it('runs new jobs while the old pool still runs its own, then frees what the old pool left locked and unlists it', async () => {
    // Each run of a job, by key; a job keyed `req_held*` runs, the first time, until the test lets it end.
    const runs: string[] = [];
    const pools: string[] = [];
    // The pools whose LISTEN for new jobs is in effect: a job added before then waits for the minute's poll.
    const listening = new Set<string>();
    // The pools listed as this process's, as src/db/liveness.ts keeps them.
    const listed = new Set<string>();
    let started = 0;
    queue = await superviseQueue(
      (events: WorkerEvents) => {
        events.on('pool:create', ({ workerPool }) => pools.push(workerPool.id));
        onListening(events, (id) => listening.add(id));
        started++;
        return run({
          ...queueOptions(2),
          pgPool: queuePool,
          events,
          taskList: {
            [EXECUTE_REQUEST]: async (payload) => {
              const key = (payload as { request_id: string }).request_id;
              runs.push(key);
              if (key.startsWith('req_held') && runs.filter((k) => k === key).length === 1) await new Promise<void>((r) => holds.set(key, r));
            },
          },
        });
      },
      queuePool,
      { add: async (id) => void listed.add(id), drop: async (id) => void listed.delete(id) },
    );
    await until(async () => (pools.length === 1 && listening.has(pools[0]) ? true : undefined), 30_000);

    // Two long jobs in the first pool; completing either fails, as it does when the database is
    // gone (here a trigger refuses their deletion).
    await pool.query(`
      CREATE FUNCTION refuse_held() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN IF OLD.key LIKE 'req_held%' THEN RAISE EXCEPTION 'completion refused'; END IF; RETURN OLD; END $$;
      CREATE TRIGGER refuse_held BEFORE DELETE ON graphile_worker._private_jobs FOR EACH ROW EXECUTE FUNCTION refuse_held()`);
    await addJob('req_held1');
    await addJob('req_held2');
    await until(async () => (holds.size === 2 ? true : undefined), 30_000);

    // The first ends; its completion fails and graphile-worker shuts the pool down, which waits
    // for the second.
    holds.get('req_held1')!();
    await until(async () => (pools.length === 2 && listening.has(pools[1]) ? true : undefined), 30_000);

    // The new pool takes a new job while the old one still runs the second.
    await addJob('req_new');
    await until(async () => (runs.includes('req_new') ? true : undefined), 30_000);
    expect(runs.filter((k) => k === 'req_held2'), 'the second long job is still in its first run').to.have.length(1);
    const locked = await lockedJobs();
    expect(locked.map((r) => r.key), 'both long jobs are still there').to.deep.equal(['req_held1', 'req_held2']);
    expect(locked.map((r) => r.locked_by !== null), 'and the old pool holds them').to.deep.equal([true, true]);

    // The second ends, and its completion succeeds: after a failed batch, that is what leaves
    // graphile-worker 0.18's pool unable to settle its runner. The job the old pool left locked
    // is freed all the same, and the new pool runs it again.
    await pool.query('DROP TRIGGER refuse_held ON graphile_worker._private_jobs');
    holds.get('req_held2')!();
    await until(async () => ((await lockedJobs()).length === 0 ? true : undefined), 30_000);
    expect(runs.filter((k) => k === 'req_held1'), 'the job whose completion failed ran again').to.have.length(2);
    expect(runs.filter((k) => k === 'req_held2')).to.have.length(1);
    expect(started, 'one replacement').to.equal(2);
    // The old pool, its jobs freed, is no longer listed.
    await until(async () => (listed.size === 1 ? true : undefined), 30_000);
    expect([...listed]).to.deep.equal([pools[1]]);

    // And the queue stops, whether or not the old pool's runner ever settles.
    const stopping = queue.stop();
    queue = null;
    await stopping;
  });
});
