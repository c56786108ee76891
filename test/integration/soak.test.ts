// The bounded soak of issue 6: hundreds of mixed requests while executors are SIGKILLed and
// restarted at random; nothing may be lost, and once everything has settled no job is left in
// the queue. The lease is the default 30 s: a job a killed executor held (fetched but not yet
// claimed, or finished but not yet completed) must be freed because its executor died, not
// because a lease's time passed.
import { expect } from 'chai';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision } from '../support/tenant.ts';
import { startDeployment, type Deployment, type SarsenProcess } from '../support/processes.ts';
import { recordingProvider, submitMixed, expectNothingLost, settled, strayJobs } from '../support/chaos.ts';

describe('soak: executors killed at random under load', function () {
  this.timeout(180_000);
  let provider: FakeProvider;
  let d: Deployment;

  before(async () => {
    provider = await startFakeProvider();
    d = await startDeployment({ sweep_interval_ms: 2000, lease_ms: 30_000, heartbeat_ms: 10_000 });
  });
  after(async () => {
    await d?.close();
    await provider?.close();
  });

  it('300 mixed requests, executors SIGKILLed and restarted: every one succeeds with its final attempt\'s bytes', async () => {
    const api = await d.start('api');
    let executors: SarsenProcess[] = [await d.start('executor'), await d.start('executor')];
    const killed: string[] = [];
    try {
      const t = await provision(d.asServer(api), provider);
      const answers = recordingProvider(provider);
      let loading = true;
      const chaos = (async () => {
        let round = 0;
        while (loading) {
          await new Promise((r) => setTimeout(r, 700 + ((round * 389) % 900)));
          if (!loading) break;
          const victim = executors[round++ % executors.length]!;
          killed.push(victim.owner!);
          await victim.kill('SIGKILL');
          executors = executors.filter((e) => e !== victim);
          executors.push(await d.start('executor'));
        }
      })();
      const { ok, refused } = await submitMixed(t, 300, 6, 'soak', 150);
      await new Promise((r) => setTimeout(r, 2000)); // keep killing while the tail executes
      loading = false;
      await chaos;
      expect(refused).to.equal(0);
      await settled(d.pool, ok.map((s) => s.id), 90_000);
      const { recoveries } = await expectNothingLost(d.pool, t, ok, answers);
      expect(killed.length).to.be.at.least(3);
      // Each recovery is an attempt that died holding a lease (checked per request above:
      // recoveries = attempts - 1, and the provider never refused). Those that had reached the
      // provider show there as calls whose client vanished mid-answer.
      const cut = provider.journal.filter((e) => e.clientAborted).length;
      expect(recoveries).to.be.at.least(cut);
      expect(recoveries).to.be.greaterThan(0);
      // Every recovery re-dispatched its request; no dead worker's job stayed behind. Nothing is
      // pending or running any more, so the queue empties.
      expect(await strayJobs(d.pool), 'jobs of no pending or running request').to.deep.equal([]);
      const { rows } = await d.pool.query(`SELECT count(*)::int AS n FROM graphile_worker.jobs`);
      expect(rows[0].n, 'jobs left in the queue').to.equal(0);
      process.stderr.write(`      (${ok.length} requests, ${killed.length} executors killed, ${recoveries} recoveries, ${rows[0].n} jobs left)\n`);
    } finally {
      for (const p of [api, ...executors]) await p.kill('SIGTERM');
    }
  });
});
