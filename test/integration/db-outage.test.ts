// Database outages under load (issue 14): a PostgreSQL the test owns is crashed (SIGKILL of
// the postmaster), shut down fast, shut down immediately, and has every backend terminated,
// while an API process and two executor processes serve a mixed load (synchronous, streaming,
// fire-and-forget, identical bodies). No process exits, nothing answers 500, callers held on
// accepted requests get their answers, streams complete or end with `event: failed`, every
// accepted request ends succeeded with its answer intact, and every process is ready again
// within 2 s of the database's return.
import { expect } from 'chai';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { startDeployment, type Deployment, type SarsenProcess } from '../support/processes.ts';
import { startOwnedPostgres, type OwnedPostgres, type Outage } from '../support/owned-postgres.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json, type RawResponse } from '../support/http.ts';
import { recordingProvider, expectNothingLost, settled, strayJobs, type Answers, type Submitted } from '../support/chaos.ts';

const OUTAGE_MS = 1500;
const READY_WITHIN_MS = 2000;

type Tally = { calls: number; unavailable: number; failures: string[]; accepted: Submitted[]; streamsFailedEvent: number };

describe('database outages under load', function () {
  this.timeout(300_000);
  let provider: FakeProvider;
  let pg: OwnedPostgres;
  let d: Deployment;
  let processes: SarsenProcess[];
  let t: Tenant;
  let answers: Answers;

  before(async () => {
    provider = await startFakeProvider();
    pg = await startOwnedPostgres();
    const db = await pg.database('sarsen_outage', { sweep_interval_ms: 200, lease_ms: 4000, heartbeat_ms: 500 });
    d = await startDeployment({}, db);
    processes = [await d.start('api'), await d.start('executor'), await d.start('executor')];
    t = await provision(d.asServer(processes[0]!), provider);
    answers = recordingProvider(provider);
  });
  after(async () => {
    await d?.close();
    await pg?.close();
    await provider?.close();
  });

  const post = (path: string, body: unknown): Promise<RawResponse> =>
    rawRequest(`${t.base}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify(body),
      timeoutMs: 30_000,
    });

  /** What a caller may see: its answer, or 503 `unavailable` with Retry-After for a submission not accepted. */
  function unavailable(res: RawResponse): boolean {
    if (res.status !== 503) return false;
    const body = json(res);
    return body?.error?.code === 'unavailable' && typeof res.headers['retry-after'] === 'string';
  }

  async function load(prefix: string, until: () => boolean): Promise<Tally> {
    const tally: Tally = { calls: 0, unavailable: 0, failures: [], accepted: [], streamsFailedEvent: 0 };
    let n = 0;
    const message = (marker: string, stream: boolean) => ({ model: 'gpt-test', stream, messages: [{ role: 'user', content: marker }] });
    const finalAnswer = (marker: string) => answers.get(marker)?.at(-1);
    const check = async (what: string, marker: string, call: () => Promise<RawResponse>, ok: (res: RawResponse) => boolean) => {
      tally.calls++;
      let res: RawResponse;
      try {
        res = await call();
      } catch (err) {
        tally.failures.push(`${what} ${marker}: ${(err as Error).message}`);
        return;
      }
      if (unavailable(res)) tally.unavailable++;
      else if (!ok(res)) tally.failures.push(`${what} ${marker}: ${res.status} ${res.body.toString('utf8').slice(0, 300)}`);
    };
    const kinds = [
      // A synchronous caller gets the provider's answer.
      async (marker: string) =>
        check('sync', marker, () => post('/chat/completions', message(marker, false)), (res) => res.status === 200 && res.body.toString('utf8') === finalAnswer(marker)),
      // A live stream completes with the provider's frames, or ends with `event: failed`.
      async (marker: string) =>
        check('stream', marker, () => post('/chat/completions', message(marker, true)), (res) => {
          const text = res.body.toString('utf8');
          if (res.status !== 200) return false;
          if (text === finalAnswer(marker)) return true;
          if (/\nevent: failed\ndata: [^\n]*\n\n$/.test(`\n${text}`)) return tally.streamsFailedEvent++ >= 0;
          return false;
        }),
      // Fire and forget: checked once everything settled.
      async (marker: string) => {
        const stream = marker.endsWith('7');
        await check('accept', marker, () => post('/requests', message(marker, stream)), (res) => {
          if (res.status !== 202) return false;
          tally.accepted.push({ id: json(res).request_id, marker, stream });
          return true;
        });
      },
      // Identical bodies at once: one execution, both callers answered with it.
      async (marker: string) => {
        await Promise.all([0, 1].map(() =>
          check('identical', marker, () => post('/chat/completions', message(marker, false)), (res) => res.status === 200 && res.body.toString('utf8') === finalAnswer(marker)),
        ));
      },
    ];
    const worker = async (w: number) => {
      while (!until()) {
        const i = n++;
        await kinds[(i + w) % kinds.length]!(`${prefix}-${i}`);
        await new Promise((r) => setTimeout(r, 20));
      }
    };
    await Promise.all(Array.from({ length: 8 }, (_, w) => worker(w)));
    return tally;
  }

  /** How long after now each process's /readyz answers 200. */
  async function readyAfter(): Promise<number[]> {
    const start = Date.now();
    return Promise.all(processes.map(async (p) => {
      for (;;) {
        const res = await rawRequest(`${p.url}/readyz`, { timeoutMs: 1000 }).catch(() => null);
        if (res?.status === 200) return Date.now() - start;
        if (Date.now() - start > 30_000) return Infinity;
        await new Promise((r) => setTimeout(r, 25));
      }
    }));
  }

  const FAULTS = {
    crash: 'a crash (postmaster SIGKILLed)',
    fast: 'a fast shutdown',
    immediate: 'an immediate shutdown',
    terminate: 'every backend terminated',
  } as const;
  for (const [fault, described] of Object.entries(FAULTS) as [keyof typeof FAULTS, string][]) {
    it(`rides out ${described} with nothing lost`, async () => {
      let stop = false;
      const loading = load(`outage-${fault}`, () => stop);
      await new Promise((r) => setTimeout(r, 1500));
      let ready: number[] = [];
      if (fault === 'terminate') {
        expect(await pg.terminateBackends('sarsen_outage')).to.be.greaterThan(0);
        ready = await readyAfter();
      } else {
        await pg.down(fault as Outage);
        await new Promise((r) => setTimeout(r, OUTAGE_MS));
        // While it is down, the processes say they are not ready.
        for (const p of processes) expect((await rawRequest(`${p.url}/readyz`)).status, `${p.role} /readyz during the outage`).to.equal(503);
        await pg.up();
        ready = await readyAfter();
      }
      await new Promise((r) => setTimeout(r, 2000));
      stop = true;
      const tally = await loading;
      if (process.env.SARSEN_TEST_LOGS) for (const p of processes) process.stderr.write(`--- ${p.role}\n${p.output().slice(-200000)}\n`);

      for (const p of processes) expect(p.child.exitCode, `${p.role} exited:\n${p.output().slice(-3000)}`).to.equal(null);
      expect(tally.failures, tally.failures.join('\n')).to.deep.equal([]);
      expect(ready.every((ms) => ms <= READY_WITHIN_MS), `ready after ${ready.join(', ')} ms`).to.equal(true);
      // Every request of the namespace ends, those whose callers were answered included: an
      // attempt whose lease ran out during the outage is run again after it.
      const all = await d.pool.query<{ id: string }>(`SELECT id FROM sarsen.requests WHERE namespace_id = $1`, [t.namespaceId]);
      await settled(d.pool, all.rows.map((r) => r.id), 60_000);
      const { rows } = await d.pool.query<{ status: string; n: number }>(
        `SELECT status, count(*)::int AS n FROM sarsen.requests WHERE namespace_id = $1 GROUP BY status`,
        [t.namespaceId],
      );
      expect(rows.filter((r) => r.status !== 'succeeded'), 'every request of the namespace succeeded').to.deep.equal([]);
      await expectNothingLost(d.pool, t, tally.accepted, answers);
      expect(await strayJobs(d.pool), 'jobs of no pending or running request').to.deep.equal([]);
      process.stderr.write(`      (${fault}: ${tally.calls} calls, ${tally.accepted.length} accepted by POST /requests, ${tally.unavailable} answered 503 unavailable, ${tally.streamsFailedEvent} streams ended with event: failed; ready after ${ready.join('/')} ms)\n`);
    });
  }
});
