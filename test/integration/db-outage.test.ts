// Database outages under load (issue 14): a PostgreSQL the test owns is crashed (SIGKILL of
// the postmaster), shut down fast, shut down immediately, and has every backend terminated,
// while an API process and two executor processes serve a mixed load (synchronous, streaming,
// fire-and-forget, identical bodies). No process exits, nothing answers 500, callers held on
// accepted requests through the outage get their answers, streams complete or end with
// `event: failed`, every accepted request ends succeeded with its answer intact, the processes
// are not ready while the database is down and ready again after it is back, and the load is
// answered (not refused with 503) both before the fault and once every process is ready again.
import { expect } from 'chai';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { startDeployment, type Deployment, type SarsenProcess } from '../support/processes.ts';
import { startOwnedPostgres, type OwnedPostgres, type Outage } from '../support/owned-postgres.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json, type RawResponse } from '../support/http.ts';
import { recordingProvider, expectNothingLost, settled, strayJobs, type Answers, type Submitted } from '../support/chaos.ts';

const OUTAGE_MS = 1500;
// Answers the load must get before the fault and again after it (each: calls answered with the
// provider's answer, and submissions accepted by POST /requests).
const MIN_ANSWERED = 8;
const MIN_ACCEPTED = 2;
const HELD_CALLERS = 3;

/** Before the fault, during it (until every process is ready again), and after. */
type Phase = 'before' | 'outage' | 'after';
type Counts = { answered: number; accepted: number };
type Tally = {
  calls: number;
  unavailable: number;
  failures: string[];
  accepted: Submitted[];
  streamsFailedEvent: number;
  /** Calls that began and ended before the fault, and calls that began after it: the database was up for all of them. */
  before: Counts;
  after: Counts;
};

describe('database outages under load', function () {
  this.timeout(300_000);
  let provider: FakeProvider;
  let pg: OwnedPostgres;
  let d: Deployment;
  let processes: SarsenProcess[];
  let t: Tenant;
  let answers: Answers;
  let phase: Phase = 'before';
  // Non-streaming calls whose marker names a hold are answered by the provider once it is released.
  const holds = new Map<string, Promise<void>>();

  before(async () => {
    provider = await startFakeProvider();
    pg = await startOwnedPostgres();
    const db = await pg.database('sarsen_outage', { sweep_interval_ms: 200, lease_ms: 4000, heartbeat_ms: 500 });
    d = await startDeployment({}, db);
    processes = [await d.start('api'), await d.start('executor'), await d.start('executor')];
    t = await provision(d.asServer(processes[0]!), provider);
    answers = recordingProvider(provider, (marker) => holds.get(marker.replace(/-\d+$/, '')));
  });
  // A failure shows what the processes logged: a stall after an outage is theirs to explain.
  afterEach(async function () {
    if (this.currentTest?.state !== 'failed') return;
    for (const p of processes ?? []) process.stderr.write(`--- ${p.role} (the last of its output)\n${p.output().slice(-20_000)}\n`);
    const { rows } = await d.pool.query(
      `SELECT application_name, state, wait_event_type, wait_event, now() - xact_start AS in_xact, left(query, 160) AS query
         FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY application_name`,
    ).catch((err: unknown) => ({ rows: [{ error: String(err) }] }));
    process.stderr.write(`--- the database's sessions\n${rows.map((r) => JSON.stringify(r)).join('\n')}\n`);
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

  /** Runs the load until `until()`, counting into `tally` as it goes. */
  async function load(tally: Tally, prefix: string, until: () => boolean): Promise<void> {
    let n = 0;
    const message = (marker: string, stream: boolean) => ({ model: 'gpt-test', stream, messages: [{ role: 'user', content: marker }] });
    const finalAnswer = (marker: string) => answers.get(marker)?.at(-1);
    /** `ok` says whether `res` is the answer the call wanted (true), another acceptable ending (false), or wrong (undefined). */
    const check = async (what: string, marker: string, call: () => Promise<RawResponse>, ok: (res: RawResponse) => boolean | undefined) => {
      tally.calls++;
      const startedIn = phase;
      let res: RawResponse;
      try {
        res = await call();
      } catch (err) {
        tally.failures.push(`${what} ${marker}: ${(err as Error).message}`);
        return;
      }
      // The database was up from the call's start to its answer: it had to be served.
      const counts = startedIn === 'after' ? tally.after : startedIn === 'before' && phase === 'before' ? tally.before : null;
      if (unavailable(res)) {
        tally.unavailable++;
        if (counts) tally.failures.push(`${what} ${marker}: 503 unavailable while the database was up (${startedIn})`);
        return;
      }
      const verdict = ok(res);
      if (verdict === undefined) tally.failures.push(`${what} ${marker}: ${res.status} ${res.body.toString('utf8').slice(0, 300)}`);
      else if (verdict && counts) counts[what === 'accept' ? 'accepted' : 'answered']++;
    };
    const kinds = [
      // A synchronous caller gets the provider's answer.
      async (marker: string) =>
        check('sync', marker, () => post('/chat/completions', message(marker, false)), (res) => (res.status === 200 && res.body.toString('utf8') === finalAnswer(marker)) || undefined),
      // A live stream completes with the provider's frames, or ends with `event: failed`.
      async (marker: string) =>
        check('stream', marker, () => post('/chat/completions', message(marker, true)), (res) => {
          const text = res.body.toString('utf8');
          if (res.status !== 200) return undefined;
          if (text === finalAnswer(marker)) return true;
          if (/\nevent: failed\ndata: [^\n]*\n\n$/.test(`\n${text}`)) {
            tally.streamsFailedEvent++;
            return false;
          }
          return undefined;
        }),
      // Fire and forget: checked once everything settled.
      async (marker: string) => {
        const stream = marker.endsWith('7');
        await check('accept', marker, () => post('/requests', message(marker, stream)), (res) => {
          if (res.status !== 202) return undefined;
          tally.accepted.push({ id: json(res).request_id, marker, stream });
          return true;
        });
      },
      // Identical bodies at once: one execution, both callers answered with it.
      async (marker: string) => {
        await Promise.all([0, 1].map(() =>
          check('identical', marker, () => post('/chat/completions', message(marker, false)), (res) => (res.status === 200 && res.body.toString('utf8') === finalAnswer(marker)) || undefined),
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
  }

  const enough = (c: Counts) => c.answered >= MIN_ANSWERED && c.accepted >= MIN_ACCEPTED;

  /** Waits until `done()`; a run that never gets there fails with `describe()`. */
  async function waitFor(what: string, done: () => boolean | Promise<boolean>, describe: () => string): Promise<void> {
    const giveUp = Date.now() + 120_000;
    while (!(await done())) {
      if (Date.now() > giveUp) expect.fail(`${what}: ${describe()}`);
      await new Promise((r) => setTimeout(r, 25));
    }
  }

  /** Waits until every process's /readyz answers 200; answers how long each took (reported, not bounded). */
  async function readyAgain(): Promise<number[]> {
    const start = Date.now();
    const ready: number[] = [];
    await waitFor('every process ready again after the database came back', async () => {
      await Promise.all(processes.map(async (p, i) => {
        if (ready[i] !== undefined) return;
        const res = await rawRequest(`${p.url}/readyz`, { timeoutMs: 1000 }).catch(() => null);
        if (res?.status === 200) ready[i] = Date.now() - start;
      }));
      return processes.every((_, i) => ready[i] !== undefined);
    }, () => `ready: ${processes.map((p, i) => `${p.role} ${ready[i] ?? 'no'}`).join(', ')}`);
    return ready;
  }

  const FAULTS = {
    crash: 'a crash (postmaster SIGKILLed)',
    fast: 'a fast shutdown',
    immediate: 'an immediate shutdown',
    terminate: 'every backend terminated',
  } as const;
  for (const [fault, described] of Object.entries(FAULTS) as [keyof typeof FAULTS, string][]) {
    it(`rides out ${described} with nothing lost, answering before and after it and the callers it held`, async () => {
      phase = 'before';
      let stop = false;
      const tally: Tally = {
        calls: 0, unavailable: 0, failures: [], accepted: [], streamsFailedEvent: 0,
        before: { answered: 0, accepted: 0 }, after: { answered: 0, accepted: 0 },
      };
      const loading = load(tally, `outage-${fault}`, () => stop);
      // Callers held across the fault: the provider has their calls (so they were accepted)
      // before it begins, and answers them only once every process is ready again.
      let release!: () => void;
      const heldPrefix = `held-${fault}`;
      holds.set(heldPrefix, new Promise<void>((r) => (release = r)));
      const heldMarkers = Array.from({ length: HELD_CALLERS }, (_, i) => `${heldPrefix}-${i}`);
      const held = heldMarkers.map((marker) =>
        post('/chat/completions', { model: 'gpt-test', stream: false, messages: [{ role: 'user', content: marker }] }),
      );
      await waitFor('the held callers reach the provider', () => heldMarkers.every((m) => answers.has(m)), () => `${heldMarkers.filter((m) => answers.has(m)).length} of ${HELD_CALLERS}`);
      await waitFor('the load answered before the fault', () => enough(tally.before), () => JSON.stringify(tally.before));

      phase = 'outage';
      let ready: number[];
      if (fault === 'terminate') {
        expect(await pg.terminateBackends('sarsen_outage')).to.be.greaterThan(0);
        ready = await readyAgain();
      } else {
        await pg.down(fault as Outage);
        await new Promise((r) => setTimeout(r, OUTAGE_MS));
        // While it is down, the processes say they are not ready.
        for (const p of processes) expect((await rawRequest(`${p.url}/readyz`)).status, `${p.role} /readyz during the outage`).to.equal(503);
        await pg.up();
        ready = await readyAgain();
      }
      phase = 'after';
      release();
      await waitFor('the load answered after every process was ready again', () => enough(tally.after), () => JSON.stringify(tally.after));
      stop = true;
      await loading;
      const heldAnswers = await Promise.all(held);
      if (process.env.SARSEN_TEST_LOGS) for (const p of processes) process.stderr.write(`--- ${p.role}\n${p.output().slice(-200000)}\n`);

      for (const p of processes) expect(p.child.exitCode, `${p.role} exited:\n${p.output().slice(-3000)}`).to.equal(null);
      expect(tally.failures, tally.failures.join('\n')).to.deep.equal([]);
      heldAnswers.forEach((res, i) => {
        expect([res.status, res.body.toString('utf8')], `held caller ${heldMarkers[i]}`).to.deep.equal([200, answers.get(heldMarkers[i]!)?.at(-1)]);
      });
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
