// src/db/jobs.ts writes graphile-worker's private job table directly on the hot path. These
// tests hold those writes to graphile-worker's own behaviour (add_job's rows and notification,
// complete_jobs's deletes, a real worker pool running and completing the jobs), so that an
// upgrade that changes the table or its meaning fails here rather than in production.
import { expect } from 'chai';
import fs from 'node:fs';
import { EventEmitter } from 'node:events';
import type pg from 'pg';
import { run, type Job, type Runner, type WorkerEvents } from 'graphile-worker';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';
import { until } from '../support/http.ts';
import { onListening } from '../support/job-pools.ts';
import {
  EXECUTE_REQUEST,
  GRAPHILE_WORKER_MIGRATIONS,
  enqueueSql,
  insertJobsSql,
  retireJobsSql,
  unlockJobs,
  wakeWorkersSql,
} from '../../src/db/jobs.ts';
import { queueOptions } from '../../src/executor/worker.ts';

type JobRow = Record<string, unknown> & { id: string; key: string; payload: unknown; payload_text: string };

/** Inserts jobs for `ids` the way a submission does, waking the workers for those due now. */
async function insertJobs(q: pg.Pool | pg.PoolClient, ids: string[], runAt = 'now()'): Promise<string[]> {
  const { rows } = await q.query<{ id: string; woken: string }>(
    `WITH job AS (${insertJobsSql(`SELECT id, ${runAt} AS run_at FROM unnest($1::text[]) AS id`)}),
          woken AS (${wakeWorkersSql(`(SELECT count(*) FROM job WHERE ${runAt} <= now())`)})
     SELECT job.id, (SELECT count(*) FROM woken) AS woken FROM job`,
    [ids],
  );
  return rows.map((r) => r.id);
}

async function jobRows(q: pg.Pool | pg.PoolClient, keys: string[]): Promise<JobRow[]> {
  const { rows } = await q.query<JobRow>(
    'SELECT *, payload::text AS payload_text FROM graphile_worker._private_jobs WHERE key = ANY($1::text[]) ORDER BY key',
    [keys],
  );
  return rows;
}

/** A job row with what legitimately differs between two jobs (id, key, payload, row times) checked for shape and set aside. */
function comparable(row: JobRow): Record<string, unknown> {
  const { id, key, payload, payload_text, created_at, updated_at, ...rest } = row;
  expect(id, 'id').to.match(/^\d+$/);
  expect(created_at, 'created_at').to.be.instanceOf(Date);
  expect(updated_at, 'updated_at').to.be.instanceOf(Date);
  expect(payload, 'payload').to.deep.equal({ request_id: key });
  return { ...rest, columns: Object.keys(row), payload_text: payload_text.replace(key, '<key>') };
}

describe('graphile-worker conformance of the direct job writes (src/db/jobs.ts)', function () {
  this.timeout(60_000);
  let db: TestDatabase;
  let pool: pg.Pool;

  before(async () => {
    db = await createTestDatabase();
    pool = testPool(db.conn, 4);
  });
  after(async () => {
    await pool?.end();
    await db?.drop();
  });

  it('package.json pins the installed graphile-worker exactly, and its schema is at the migration the writes were made for', async () => {
    const wanted = JSON.parse(fs.readFileSync('package.json', 'utf8')).dependencies['graphile-worker'];
    const installed = JSON.parse(fs.readFileSync('node_modules/graphile-worker/package.json', 'utf8')).version;
    expect(wanted, 'package.json must name one exact graphile-worker version').to.equal(installed);
    const { rows } = await pool.query<{ n: number }>('SELECT count(*)::int AS n FROM graphile_worker.migrations');
    expect(
      rows[0]!.n,
      `graphile-worker ${installed} has ${rows[0]!.n} schema migrations; src/db/jobs.ts was written against ` +
        `${GRAPHILE_WORKER_MIGRATIONS}. Read the new migrations (node_modules/graphile-worker/sql/), re-check ` +
        'insertJobsSql, retireJobsSql and wakeWorkersSql against add_jobs and complete_jobs, ' +
        'make this suite pass, then update GRAPHILE_WORKER_MIGRATIONS',
    ).to.equal(GRAPHILE_WORKER_MIGRATIONS);
  });

  it('a job Sarsen inserts is, column for column, the job add_job writes: due now, and due at a lease\'s end', async () => {
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      for (const [name, runAt] of [['now', undefined], ['later', "now() + interval '30 seconds'"]] as const) {
        const theirs = `req_add_job_${name}`;
        const ours = `req_sarsen_${name}`;
        await client.query(`SELECT ${enqueueSql('$1::text', runAt)}`, [theirs]);
        await insertJobs(client, [ours], runAt);
        const rows = await jobRows(client, [theirs, ours]);
        expect(rows.map((r) => r.key)).to.deep.equal([theirs, ours]);
        const [gw, sarsen] = rows.map(comparable);
        // One transaction: now() is the same for both, so run_at compares exactly.
        expect(sarsen, `the job due ${name}`).to.deep.equal(gw);
      }
      const { rows: tasks } = await client.query('SELECT * FROM graphile_worker._private_tasks WHERE identifier = $1', [EXECUTE_REQUEST]);
      expect(tasks.map((t) => Object.keys(t).sort())).to.deep.equal([['id', 'identifier']]);
    } finally {
      await client.query('ROLLBACK');
      client.release();
    }
  });

  it('wakes the worker pools with the jobs:insert notification add_jobs sends, and sends none when no job is due', async () => {
    const client = await pool.connect();
    const heard: string[] = [];
    const onNotice = (m: pg.Notification) => heard.push(m.payload ?? '');
    client.on('notification', onNotice);
    try {
      await client.query('LISTEN "jobs:insert"');
      await pool.query(`SELECT ${enqueueSql('$1::text')}`, ['req_wake_add_job']);
      const theirs = await until(async () => heard.shift());
      await pool.query(wakeWorkersSql('0'));
      await pool.query(`SELECT pg_notify('jobs:insert', 'marker')`);
      expect(await until(async () => heard.shift()), 'nothing is sent for no due job').to.equal('marker');
      await pool.query(wakeWorkersSql('3'));
      const ours = await until(async () => heard.shift());
      const [gw, sarsen] = [JSON.parse(theirs), JSON.parse(ours)] as Record<string, unknown>[];
      const shape = (o: Record<string, unknown>) => Object.entries(o).map(([k, v]) => [k, typeof v]).sort();
      expect(shape(sarsen!)).to.deep.equal(shape(gw!));
      expect(gw!.count).to.equal(1);
      expect(sarsen!.count).to.equal(3);
    } finally {
      client.off('notification', onNotice);
      await client.query('UNLISTEN *');
      client.release();
      await pool.query('SELECT graphile_worker.remove_job($1)', ['req_wake_add_job']);
    }
  });

  describe('with a graphile-worker pool running as the executor runs it', () => {
    const CONCURRENCY = 2;
    let runner: Runner;
    const failures: string[] = [];
    const starts = new Map<string, Job[]>();
    const gates = new Map<string, { open: Promise<void>; release(): void }>();
    const gate = (requestId: string) => {
      let g = gates.get(requestId);
      if (!g) {
        let release!: () => void;
        g = { open: new Promise<void>((r) => (release = r)), release: () => release() };
        gates.set(requestId, g);
      }
      return g;
    };
    /** Waits until the worker has started a job for `requestId` `n` times; answers the n-th. */
    const started = (requestId: string, n = 1) => until(async () => starts.get(requestId)?.[n - 1], 30_000);
    const gone = (key: string) => until(async () => ((await jobRows(pool, [key])).length === 0 ? true : undefined), 30_000);

    before(async () => {
      const events: WorkerEvents = new EventEmitter() as WorkerEvents;
      let fetchedNothing!: () => void;
      const ready = Promise.all([new Promise<void>((r) => onListening(events, () => r())), new Promise<void>((r) => (fetchedNothing = r))]);
      events.on('localQueue:getJobs:complete', ({ jobs }) => jobs.length === 0 && fetchedNothing());
      events.on('job:error', ({ job, error }) => failures.push(`${job.key}: ${String(error)}`));
      runner = await run({
        ...queueOptions(CONCURRENCY),
        // Nothing is found by polling during this suite: only a notification makes the pool look.
        pollInterval: 3_600_000,
        pgPool: pool,
        events,
        taskList: {
          [EXECUTE_REQUEST]: async (payload, helpers) => {
            const { request_id } = payload as { request_id: string };
            starts.set(request_id, [...(starts.get(request_id) ?? []), helpers.job]);
            await gate(request_id).open;
          },
        },
      });
      await ready;
    });
    after(async () => {
      for (const g of gates.values()) g.release();
      await runner?.stop();
      expect(failures, 'no job failed').to.deep.equal([]);
    });

    it('runs a job Sarsen inserted, found through its wake-up alone, and completes it', async () => {
      const [id] = await insertJobs(pool, ['req_run']);
      const job = await started('req_run');
      expect(job.id).to.equal(id);
      expect(job.task_identifier).to.equal(EXECUTE_REQUEST);
      expect(job.payload).to.deep.equal({ request_id: 'req_run' });
      gate('req_run').release();
      await gone('req_run');
    });

    it('retires a job a worker holds; that worker completes it harmlessly, and add_job queues the request afresh', async () => {
      const [first] = await insertJobs(pool, ['req_retire']);
      await started('req_retire');
      const retired = await pool.query(retireJobsSql('$1::text[]'), [['req_retire']]);
      expect(retired.rowCount).to.equal(1);
      expect(await jobRows(pool, ['req_retire'])).to.deep.equal([]);
      // What a recovery does next.
      await pool.query(`SELECT ${enqueueSql('$1::text')}`, ['req_retire']);
      const again = await started('req_retire', 2);
      expect(again.id).to.not.equal(first);
      gate('req_retire').release();
      await gone('req_retire');
    });

    it('unlockJobs frees, through force_unlock_workers, the jobs a stopped pool holds', async () => {
      await insertJobs(pool, ['req_unlock']);
      await started('req_unlock');
      const [held] = await jobRows(pool, ['req_unlock']);
      expect(held!.locked_by).to.be.a('string');
      await unlockJobs(pool, [held!.locked_by as string]);
      const [freed] = await jobRows(pool, ['req_unlock']);
      expect([freed!.locked_at, freed!.locked_by]).to.deep.equal([null, null]);
      gate('req_unlock').release();
      await gone('req_unlock');
    });
  });
});
