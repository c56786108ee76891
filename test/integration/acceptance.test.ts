// Accepting and running in one process (issue 13): a process with the executor role claims what
// it accepts in the submission statement and calls the provider at once, with no job pickup in
// between, and writes it no graphile-worker job: its lease, renewed while the attempt lives, is
// what recovery goes by. What finds no free slot waits as a job, and what the accepting process
// was running when it died is run again by another executor.
import { expect } from 'chai';
import { chatCompletionBody, startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startDeployment } from '../support/processes.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json, until } from '../support/http.ts';
import type pg from 'pg';
import { namespaceTotals } from '../../src/db/accounting.ts';

type Job = { task_identifier: string; run_at: Date; locked_at: Date | null; attempts: number; due_in_ms: number; past_run_at: boolean };

// past_run_at: whether the database's clock has passed `runAt` (a run_at read earlier).
const jobOf = async (pool: pg.Pool, id: string, runAt: Date | null = null): Promise<Job[]> =>
  (await pool.query<Job>(
    `SELECT task_identifier, run_at, locked_at, attempts, (extract(epoch FROM run_at - now()) * 1000)::float8 AS due_in_ms,
            coalesce(now() > $2::timestamptz, false) AS past_run_at
       FROM graphile_worker.jobs WHERE key = $1`,
    [id, runAt],
  )).rows;
// past: whether the database's clock has passed the end of the first lease (2 s in the test that reads it).
const leaseOf = async (pool: pg.Pool, id: string): Promise<{ status: string; attempts: number; recoveries: number; lease_expires_at: Date; past: boolean }> =>
  (await pool.query(
    `SELECT status, attempts, recoveries, lease_expires_at, now() > started_at + interval '2 seconds' AS past FROM sarsen.requests WHERE id = $1`,
    [id],
  )).rows[0];
const rowOf = async (pool: pg.Pool, id: string) =>
  (await pool.query(`SELECT status, attempts, recoveries, lease_owner FROM sarsen.requests WHERE id = $1`, [id])).rows[0];

const post = async (t: Tenant, content: string): Promise<{ request_id: string; status: string }> => {
  const res = await rawRequest(`${t.base}/requests`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
    body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content }] }),
  });
  expect(res.status).to.equal(202);
  return json(res);
};

const submit = async (t: Tenant, content: string): Promise<string> => {
  const accepted = await post(t, content);
  // Accepted is pending (the contract), even when this process already claimed it.
  expect(accepted.status).to.equal('pending');
  return accepted.request_id;
};

describe('claimed at acceptance (role both)', function () {
  this.timeout(90_000);
  let provider: FakeProvider;

  before(async () => {
    provider = await startFakeProvider();
  });
  after(async () => {
    await provider?.close();
  });
  beforeEach(() => provider.reset());

  describe('in one process', () => {
    let server: TestServer;
    let t: Tenant;
    before(async () => {
      server = await startTestServer({ settings: { lease_ms: 2000, heartbeat_ms: 400, sweep_interval_ms: 100 }, executorConcurrency: 2 });
      t = await provision(server, provider);
    });
    after(async () => {
      await server?.close();
    });

    it('runs what it accepted at once under its lease alone, with no job row, the heartbeat moving the lease on', async () => {
      // The provider answers only once the test has seen the lease moved on, so it cannot finish first.
      let release!: () => void;
      const released = new Promise<void>((resolve) => (release = resolve));
      provider.enqueue({ kind: 'json', body: chatCompletionBody('a long answer'), after: released });
      const id = await submit(t, 'a long answer');
      await provider.waitForRequests(1);
      // Claimed by the statement that accepted it: running under this process's lease, and no
      // job written (the watcher recovers it by its lease should this process die).
      const running = await rowOf(server.pool, id);
      expect(running).to.include({ status: 'running', attempts: 1, recoveries: 0 });
      expect(running.lease_owner).to.match(/^wrk_/);
      expect(await jobOf(server.pool, id)).to.deep.equal([]);
      // Past the first lease's end the heartbeat has moved the lease on: nobody recovered it.
      const first = await leaseOf(server.pool, id);
      const later = await until(async () => {
        const moved = await leaseOf(server.pool, id);
        return moved.past && moved.lease_expires_at > first.lease_expires_at ? moved : undefined;
      });
      expect(later).to.include({ status: 'running', attempts: 1, recoveries: 0 });
      expect(await jobOf(server.pool, id)).to.deep.equal([]);
      release();
      const done = await until(async () => ((await rowOf(server.pool, id)).status === 'succeeded' ? true : undefined), 15_000);
      expect(done).to.equal(true);
      expect(await rowOf(server.pool, id)).to.include({ attempts: 1, recoveries: 0 });
      expect(await jobOf(server.pool, id)).to.deep.equal([]);
      expect(provider.journal).to.have.length(1);
    });

    it('what finds no free slot waits as a job due now, and is run through the queue', async () => {
      provider.rule(() => ({ kind: 'default', delayMs: 800 }));
      const ids: string[] = [];
      for (let i = 0; i < 4; i++) ids.push(await submit(t, `overflow ${i}`));
      await until(async () => ((await Promise.all(ids.map((id) => rowOf(server.pool, id)))).every((r) => r.status === 'succeeded') ? true : undefined), 20_000);
      // A job run through the queue is completed by graphile-worker once its task returns, a moment
      // after the terminal write committed: wait for that, then none may remain.
      await until(async () => ((await Promise.all(ids.map((id) => jobOf(server.pool, id)))).every((jobs) => jobs.length === 0) ? true : undefined), 5_000).catch(() => undefined);
      for (const id of ids) {
        expect(await rowOf(server.pool, id)).to.include({ attempts: 1, recoveries: 0 });
        expect(await jobOf(server.pool, id)).to.deep.equal([]);
      }
      expect(provider.journal).to.have.length(4);
      // Two slots: two were claimed by the statement that accepted them (started as they were
      // created); the others were written pending with a job due now, and claimed from it later.
      const { rows } = await server.pool.query(
        `SELECT count(*) FILTER (WHERE started_at = created_at)::int AS at_acceptance,
                count(*) FILTER (WHERE started_at > created_at)::int AS from_jobs
           FROM sarsen.requests WHERE id = ANY($1::text[])`,
        [ids],
      );
      expect(rows[0]).to.deep.equal({ at_acceptance: 2, from_jobs: 2 });
    });

    it('accepts a burst in two statements at once, and identical bodies in it still make one execution each', async () => {
      const u = await provision(server, provider);
      const landed = new Map<string, Set<string>>(); // body -> request ids it was answered
      // Statements on the spare submission lane, which opens only beside a flush in flight.
      const spare = async () => {
        const text = await (await fetch(`${server.url}/metrics`)).text();
        return Number(/^sarsen_group_commits_total\{writer="submissions",lane="1"\} (\d+)$/m.exec(text)?.[1] ?? 0);
      };
      const spareBefore = await spare();
      const lanes = async () => ((await spare()) > spareBefore ? 2 : 1);
      let waves = 0;
      while (waves < 5 && (waves === 0 || (await lanes()) < 2)) {
        waves++;
        const contents = Array.from({ length: 24 }, (_, i) => `lanes ${waves} ${i}`);
        // (An attach answers the execution's status as it is: pending, running or even done.)
        const answers = await Promise.all(contents.flatMap((c) => [c, c, c]).map(async (c) => [c, (await post(u, c)).request_id] as const));
        for (const [c, id] of answers) landed.set(c, (landed.get(c) ?? new Set()).add(id));
      }
      expect(await lanes()).to.equal(2, 'the burst was accepted on both submission connections');
      for (const [c, ids] of landed) expect([...ids], c).to.have.length(1);

      const ids = [...landed.values()].map((s) => [...s][0]!);
      await until(async () => ((await Promise.all(ids.map((id) => rowOf(server.pool, id)))).every((r) => r.status === 'succeeded') ? true : undefined), 30_000);
      const calls = provider.journal.filter((e) => String(e.json?.messages?.[0]?.content).startsWith('lanes '));
      expect(calls).to.have.length(landed.size, 'one provider call per distinct body');
      const totals = await namespaceTotals(server.pool, u.namespaceId);
      expect({ accepted: Number(totals.accepted_submissions), calls: Number(totals.provider_calls) }).to.deep.equal({ accepted: landed.size * 3, calls: landed.size });
    });
  });

  it('what the accepting process was running when it was killed, another executor runs again', async () => {
    const d = await startDeployment({ sweep_interval_ms: 100, lease_ms: 3000, heartbeat_ms: 500 });
    try {
      const accepting = await d.start('both');
      const other = await d.start('executor');
      const t = await provision(d.asServer(accepting), provider);
      provider.enqueue({ kind: 'hang' }, { kind: 'default' });
      const id = await submit(t, 'survive me');
      await provider.waitForRequests(1);
      // No job pickup: the accepting process holds the lease it took at acceptance.
      expect(await rowOf(d.pool, id)).to.include({ status: 'running', attempts: 1, lease_owner: accepting.owner });
      expect(await jobOf(d.pool, id)).to.deep.equal([]);
      // No job either: the watcher finds its owner dead and re-dispatches it.
      await accepting.kill('SIGKILL');
      await until(async () => ((await rowOf(d.pool, id)).status === 'succeeded' ? true : undefined), 30_000);
      expect(await rowOf(d.pool, id)).to.include({ attempts: 2, recoveries: 1, lease_owner: null });
      expect(provider.journal).to.have.length(2);
      // graphile-worker completes the job (deletes it) in a batch just after the task returned,
      // which is after the answer committed.
      await until(async () => ((await jobOf(d.pool, id)).length === 0 ? true : undefined), 5_000);
      await other.kill('SIGTERM');
    } finally {
      await d.close();
    }
  });
});
