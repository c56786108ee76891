// Recovery under load (issue 29): real executor processes SIGKILLed while about 40 submissions
// a second arrive, first one of three at a time, then all at once with new ones started. The
// sweep interval and the lease are ten minutes here, so a recovery within this test came from
// the liveness watch, never from a sweep's timer or an expired lease. The figures (kill → new
// attempt) are printed, not asserted: the machine is shared.
import { expect } from 'chai';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision } from '../support/tenant.ts';
import { startDeployment, type Deployment, type SarsenProcess } from '../support/processes.ts';
import { expectNothingLost, settled, strayJobs } from '../support/chaos.ts';
import { slowRecordingProvider, startLoad, heldBy, movedOn, recoveryFigures, describeFigures, type Kill } from './recovery-support.ts';

const TEN_MINUTES = 600_000;
const RATE = 40;

describe('recovery under load', function () {
  this.timeout(300_000);
  let provider: FakeProvider;
  let d: Deployment;

  before(async () => {
    provider = await startFakeProvider();
    d = await startDeployment({ sweep_interval_ms: TEN_MINUTES, lease_ms: TEN_MINUTES, heartbeat_ms: 10_000 });
  });
  after(async () => {
    await d?.close();
    await provider?.close();
  });

  it('executors SIGKILLed under ~40 submissions/s: every attempt they held is taken up again exactly once, without waiting for a sweep or a lease', async () => {
    const api = await d.start('api');
    let executors: SarsenProcess[] = await Promise.all([d.start('executor'), d.start('executor'), d.start('executor')]);
    const single: Kill[] = [];
    const all: Kill[] = [];
    const startups: number[] = []; // kill → the first new process listening, per round of all at once
    try {
      const t = await provision(d.asServer(api), provider);
      const answers = slowRecordingProvider(provider, 1000);
      const load = startLoad(t, RATE, 'rl');
      await new Promise((r) => setTimeout(r, 3000));

      // One of three at a time; its replacement starts only once what it held was taken up
      // again, so no starting process's first sweep does the work.
      for (let round = 0; round < 8; round++) {
        const victim = executors[round % executors.length]!;
        const kill: Kill = { owner: victim.owner!, at: 0, held: await heldBy(d.pool, victim.owner!) };
        kill.at = Date.now();
        await victim.kill('SIGKILL');
        single.push(kill);
        await movedOn(d.pool, kill, 120_000);
        executors = executors.filter((e) => e !== victim);
        executors.push(await d.start('executor'));
        await new Promise((r) => setTimeout(r, 1500));
      }

      // All at once, new processes started at once.
      for (let round = 0; round < 3; round++) {
        const kills: Kill[] = await Promise.all(executors.map(async (e) => ({ owner: e.owner!, at: 0, held: await heldBy(d.pool, e.owner!) })));
        const at = Date.now();
        await Promise.all(executors.map((e) => e.kill('SIGKILL')));
        for (const k of kills) k.at = at;
        all.push(...kills);
        const starting = [d.start('executor'), d.start('executor'), d.start('executor')];
        void Promise.race(starting).then(() => startups.push(Date.now() - at));
        executors = await Promise.all(starting);
        for (const k of kills) await movedOn(d.pool, k, 120_000);
        await new Promise((r) => setTimeout(r, 3000));
      }

      await load.stop();
      expect(load.refused()).to.equal(0);
      await settled(d.pool, load.accepted.map((s) => s.id), 120_000);
      await expectNothingLost(d.pool, t, load.accepted, answers);
      expect(await strayJobs(d.pool), 'jobs of no pending or running request').to.deep.equal([]);

      const markers = new Map(load.accepted.map((s) => [s.id, s.marker]));
      const one = await recoveryFigures(d.pool, provider, single, markers);
      const every = await recoveryFigures(d.pool, provider, all, markers);
      process.stderr.write(`      (${load.accepted.length} requests at ${RATE}/s)\n`);
      process.stderr.write(`      (${describeFigures('one of three killed', one)})\n`);
      process.stderr.write(`      (${describeFigures('all three killed, three started', every)}; the first new process listened ${startups.map((ms) => `${ms} ms`).join(', ')} after the kill)\n`);
      expect(one.victims, 'attempts a single kill ended').to.be.greaterThan(0);
      expect(every.victims, 'attempts killing all ended').to.be.greaterThan(0);
    } finally {
      for (const p of [api, ...executors]) await p.kill('SIGTERM');
    }
  });
});
