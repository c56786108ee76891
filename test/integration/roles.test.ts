// Roles and graceful shutdown with real processes (issue 6): api serves HTTP and runs no
// tasks; executor runs tasks and serves health only; SIGTERM lets in-flight executions
// finish within the grace and hands back what cannot.
import { expect } from 'chai';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { startDeployment, type Deployment } from '../support/processes.ts';
import { rawRequest, json, until } from '../support/http.ts';

describe('roles and graceful shutdown', function () {
  this.timeout(120_000);
  let provider: FakeProvider;
  let d: Deployment;

  before(async () => {
    provider = await startFakeProvider();
    d = await startDeployment({ sweep_interval_ms: 100, lease_ms: 5000, heartbeat_ms: 1000 });
  });
  after(async () => {
    await d?.close();
    await provider?.close();
  });
  beforeEach(() => provider.reset());

  const submit = (t: Tenant, content: string, stream = false) =>
    rawRequest(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', stream, messages: [{ role: 'user', content }] }),
    }).then((r) => json(r).request_id as string);
  const record = async (t: Tenant, id: string) => json(await rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key } }));
  const setGrace = async (ms: number) => {
    await d.pool.query(`UPDATE sarsen.settings SET value = $1::jsonb WHERE name = 'shutdown_grace_ms'`, [String(ms)]);
    await new Promise((r) => setTimeout(r, 300)); // the processes' settings caches refresh on NOTIFY
  };

  it('an api process runs no tasks, an executor serves health only; together they execute', async () => {
    const api = await d.start('api');
    const listener = await d.pool.connect();
    try {
      const t = await provision(d.asServer(api), provider);
      const notices: string[] = [];
      listener.on('notification', (n) => void (n.channel === 'jobs:insert' && notices.push(n.payload ?? '')));
      await listener.query('LISTEN "jobs:insert"');
      const id = await submit(t, 'waits for an executor');
      await new Promise((r) => setTimeout(r, 1000));
      expect(await record(t, id)).to.include({ status: 'pending', attempts: 0 });
      expect(provider.journal).to.have.length(0);
      // Operators find a request's pending work by its id (docs/operations.md "Inspecting the
      // queue"). The job is written as add_job writes it, with the notice that wakes the worker
      // pools.
      const job = await d.pool.query(
        `SELECT task_identifier, queue_name, priority, attempts, max_attempts, revision, locked_at, run_at <= now() AS due, flags
           FROM graphile_worker.jobs WHERE key = $1`,
        [id],
      );
      expect(job.rows).to.deep.equal([
        { task_identifier: 'execute_request', queue_name: null, priority: 0, attempts: 0, max_attempts: 25, revision: 0, locked_at: null, due: true, flags: null },
      ]);
      expect(notices.map((n) => (JSON.parse(n) as { count: number }).count)).to.deep.equal([1]);

      const executor = await d.start('executor');
      try {
        expect((await fetch(`${executor.url}/healthz`)).status).to.equal(200);
        const routed = await rawRequest(`${executor.url}/${t.tenancy}/${t.namespace}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
          body: '{"model":"gpt-test","messages":[]}',
        });
        expect(routed.status).to.equal(404);
        const admin = await rawRequest(`${executor.url}/${t.tenancy}/v1/namespaces`, { headers: { authorization: `Bearer ${t.adminToken}` } });
        expect(admin.status).to.equal(404);
        const done = await until(async () => ((await record(t, id)).status === 'succeeded' ? true : undefined));
        expect(done).to.equal(true);
      } finally {
        expect((await executor.kill('SIGTERM')).code).to.equal(0);
      }
    } finally {
      await listener.query('UNLISTEN *').catch(() => undefined);
      listener.release();
      await api.kill('SIGTERM');
    }
  });

  it('SIGTERM lets an in-flight stream finish within the grace, then exits 0', async () => {
    await setGrace(15_000);
    const api = await d.start('api');
    const executor = await d.start('executor');
    try {
      const t = await provision(d.asServer(api), provider);
      provider.enqueue({ kind: 'sse', frames: chatFrames(Array.from({ length: 30 }, (_, i) => `p${i}`)), frameDelayMs: 50 });
      const id = await submit(t, 'finish me', true);
      await provider.waitForRequests(1);
      const { code } = await executor.kill('SIGTERM');
      expect(code, executor.output()).to.equal(0);
      expect(await record(t, id)).to.include({ status: 'succeeded', attempts: 1, recoveries: 0 });
      expect(provider.journal[0]!.clientAborted).to.equal(false);
    } finally {
      await api.kill('SIGTERM');
    }
  });

  it('what cannot finish within the grace is handed back at once and another executor takes over', async () => {
    await setGrace(300);
    const api = await d.start('api');
    const first = await d.start('executor');
    const second = await d.start('executor');
    try {
      const t = await provision(d.asServer(api), provider);
      provider.rule(() => ({ kind: 'sse', frames: chatFrames(Array.from({ length: 40 }, (_, i) => `q${i}`)), frameDelayMs: 50 }));
      const id = await submit(t, 'hand me back', true);
      await provider.waitForRequests(1);
      const { rows } = await d.pool.query(`SELECT lease_owner FROM sarsen.requests WHERE id = $1`, [id]);
      const holder = [first, second].find((e) => e.owner === rows[0].lease_owner)!;
      expect((await holder.kill('SIGTERM')).code, holder.output()).to.equal(0);
      // The stopping process handed the lease back itself, before it exited.
      expect(holder.output()).to.match(/"handed":true[^\n]*"message":"attempt handed back"[^\n]*"reason":"shutdown"/);
      const rec = await until(async () => {
        const r = await record(t, id);
        return r.status === 'succeeded' ? r : undefined;
      }, 30_000);
      expect(rec).to.include({ attempts: 2, recoveries: 1 });
      expect(provider.journal).to.have.length(2);
      expect(provider.journal[0]!.clientAborted).to.equal(true); // the handed-back call was stopped
    } finally {
      for (const p of [api, first, second]) await p.kill('SIGTERM');
    }
  });
});
