// Many processes on one primary (docs/scaling.md): four pairs, then eight, of `--role api` and
// `--role executor` processes on one database, under a mixed load spread over the api processes
// (synchronous and streaming calls, POST /requests, identical bodies sent to two processes at
// once, replays by id from a process other than the one that accepted), while the executor holding
// the most leases is SIGKILLed every few seconds and another started. Nothing is lost, nothing runs
// twice, what the victims held is recovered, every answer and every replay is the provider's bytes,
// and the processes are told only what they read.
import { expect } from 'chai';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';
import { makeSecretsDir, type SecretsDir } from '../support/child.ts';
import { provision } from '../support/tenant.ts';
import type { TestServer } from '../support/server.ts';
import { startProcess, type FleetProcess } from '../support/fleet.ts';
import { answerLoad, startMixedLoad, verifyStored, tally } from '../support/mixed-load.ts';
import { until } from '../support/http.ts';

const PAIRS = [4, 8];
const KILL_EVERY_MS = 3000;
const KILLS = 3;

describe('many processes on one primary', function () {
  this.timeout(300_000);
  let provider: FakeProvider;
  let db: TestDatabase;
  let secrets: SecretsDir;
  let pool: ReturnType<typeof testPool>;
  const procs = new Set<FleetProcess>();

  before(async () => {
    provider = await startFakeProvider();
    answerLoad(provider, 20);
    db = await createTestDatabase({ sweep_interval_ms: 250, lease_ms: 5000, heartbeat_ms: 1000 });
    secrets = makeSecretsDir(db.conn);
    pool = testPool(db.conn, 2);
  });
  afterEach(async () => {
    await Promise.all([...procs].map((p) => p.kill('SIGKILL')));
    procs.clear();
  });
  after(async () => {
    await pool?.end();
    secrets?.remove();
    await db?.drop();
    await provider?.close();
  });

  // Within PostgreSQL's default max_connections (100): 4 pairs with room to spare (56), 8 at
  // each role's minimum (80).
  const connections = (pairs: number, role: 'api' | 'executor') => (pairs <= 4 ? { api: 6, executor: 8 } : { api: 4, executor: 6 })[role];

  for (const pairs of PAIRS) {
    const start = async (role: 'api' | 'executor') => {
      const p = await startProcess(db.conn, secrets.dir, role, ['--database-connections', String(connections(pairs, role))]);
      procs.add(p);
      return p;
    };
    // A few at a time: each process starting costs a core for a moment.
    const startMany = async (n: number, role: 'api' | 'executor') => {
      const started: FleetProcess[] = [];
      for (let i = 0; i < n; i += 4) started.push(...(await Promise.all(Array.from({ length: Math.min(4, n - i) }, () => start(role)))));
      return started;
    };

    it(`${pairs} api and ${pairs} executor processes serve a mixed load with an executor SIGKILLed every ${KILL_EVERY_MS / 1000} s: nothing lost, nothing run twice, every replay exact`, async () => {
      const apis = await startMany(pairs, 'api');
      let executors = await startMany(pairs, 'executor');
      const t = await provision({ url: apis[0]!.url, pool, db } as unknown as TestServer, provider);

      const load = startMixedLoad(apis.map((a) => a.url), t, { concurrency: 24 });
      const killed: FleetProcess[] = [];
      // The requests each victim held a lease on when it was killed: the ones it left to recover.
      const held: string[] = [];
      while (killed.length < KILLS) {
        await new Promise((r) => setTimeout(r, KILL_EVERY_MS));
        // The one running the most attempts, so that the kill lands on work in flight (a random
        // one may hold nothing, and then nothing is left to recover).
        const { rows: holders } = await pool.query<{ owner: string; ids: string[] }>(
          `SELECT lease_owner AS owner, array_agg(id) AS ids FROM sarsen.requests WHERE status = 'running' AND lease_owner IS NOT NULL GROUP BY lease_owner ORDER BY count(*) DESC`,
        );
        const holder = holders.find((h) => executors.some((e) => e.processId === h.owner));
        const victim = executors.find((e) => e.processId === holder?.owner) ?? executors[0]!;
        if (holder) held.push(...holder.ids);
        await victim.kill('SIGKILL');
        procs.delete(victim);
        killed.push(victim);
        executors = [...executors.filter((e) => e !== victim), await start('executor')];
      }
      await new Promise((r) => setTimeout(r, KILL_EVERY_MS));
      const summary = await load.stop();
      const check = await until(async () => {
        const c = await verifyStored(pool, provider, summary.accepted);
        return c.unfinished.length === 0 ? c : undefined;
      }, 90_000, 250);
      const recovered = (await pool.query<{ n: number }>('SELECT coalesce(sum(recoveries), 0)::int AS n FROM sarsen.requests WHERE namespace_id = $1', [t.namespaceId])).rows[0]!.n;
      // Some of what a victim held may have ended between the query and the kill; not all of it.
      const heldRecovered = (await pool.query<{ n: number }>('SELECT coalesce(sum(recoveries), 0)::int AS n FROM sarsen.requests WHERE id = ANY($1)', [held])).rows[0]!.n;
      const streams = summary.ops.filter((o) => o.stream);
      console.log(`      ${summary.ops.length} calls (${tally(summary.ops)}); ${check.requests} requests, ${recovered} recovered; ${killed.length} executors killed, holding ${held.length} (${heldRecovered} recovered);`
        + ` streams ${streams.filter((o) => o.stream === 'finished').length} finished, ${streams.filter((o) => o.stream === 'superseded').length} superseded`);

      expect(summary.errors, summary.errors.join('\n')).to.deep.equal([]);
      expect(summary.mismatches, summary.mismatches.join('\n')).to.deep.equal([]);
      expect(summary.ops.filter((o) => o.status >= 300), tally(summary.ops)).to.deep.equal([]);
      // A live stream whose attempt died ends with `event: failed` (superseded), never cut short.
      expect(streams.filter((o) => o.stream !== 'finished' && o.stream !== 'superseded')).to.deep.equal([]);
      expect(check.lostAccepted, 'accepted requests missing').to.deep.equal([]);
      expect(held, 'requests the killed executors held leases on').to.not.be.empty;
      expect(heldRecovered, 'recoveries of the requests the killed executors held').to.be.greaterThan(0);
      expect(check.doubleCalls, 'provider calls beyond one per attempt, or bodies that ran as two requests').to.deep.equal([]);
      expect(summary.ops.filter((o) => o.kind === 'replay').length).to.be.greaterThan(0);
      expect(summary.ops.filter((o) => o.kind === 'duplicate').length).to.be.greaterThan(0);
      // The api processes outlived the kills.
      for (const a of apis) expect(a.child.exitCode, a.output().slice(-2000)).to.equal(null);
    });
  }
});
