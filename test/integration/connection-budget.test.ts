// The connection budget (docs/scaling.md): under a mixed load, the connections each process
// holds (pg_stat_activity, sampled all along) never exceed the count its role and
// --database-connections allow, in total and by purpose; /metrics reports them.
import { expect } from 'chai';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';
import { makeSecretsDir, type SecretsDir } from '../support/child.ts';
import { provision } from '../support/tenant.ts';
import type { TestServer } from '../support/server.ts';
import { startProcess, CONNECTIONS_SQL, type FleetProcess } from '../support/fleet.ts';
import { answerLoad, startMixedLoad, verifyStored, tally } from '../support/mixed-load.ts';
import { until } from '../support/http.ts';
import { connectionBudget, minimumConnections, PURPOSES, type ConnectionBudget } from '../../src/core/connection-budget.ts';
import type { Role } from '../../src/config/config.ts';

type Peaks = Map<string, Map<string, number>>; // process id -> purpose (and 'total') -> most seen at once

/** Samples the connections of every Sarsen process on `db` until stopped; answers the peaks. */
function sampleConnections(pool: ReturnType<typeof testPool>, db: string) {
  const peaks: Peaks = new Map();
  let running = true;
  const loop = (async () => {
    while (running) {
      const { rows } = await pool.query<{ process: string; purpose: string; n: number }>(CONNECTIONS_SQL, [db]);
      const totals = new Map<string, number>();
      for (const r of rows) {
        const p = peaks.get(r.process) ?? new Map<string, number>();
        peaks.set(r.process, p);
        p.set(r.purpose, Math.max(p.get(r.purpose) ?? 0, r.n));
        totals.set(r.process, (totals.get(r.process) ?? 0) + r.n);
      }
      for (const [proc, n] of totals) peaks.get(proc)!.set('total', Math.max(peaks.get(proc)!.get('total') ?? 0, n));
      await new Promise((r) => setTimeout(r, 20));
    }
  })();
  return {
    async stop(): Promise<Peaks> {
      running = false;
      await loop;
      return peaks;
    },
  };
}

const describePeaks = (p: Map<string, number> | undefined) => [...(p ?? [])].sort().map(([k, n]) => `${k}=${n}`).join(' ');

describe('connection budget', function () {
  this.timeout(240_000);
  let provider: FakeProvider;
  let db: TestDatabase;
  let secrets: SecretsDir;
  let pool: ReturnType<typeof testPool>;
  const procs: FleetProcess[] = [];

  before(async () => {
    provider = await startFakeProvider();
    answerLoad(provider);
    db = await createTestDatabase({ sweep_interval_ms: 200 });
    secrets = makeSecretsDir(db.conn);
    pool = testPool(db.conn, 2);
  });
  afterEach(async () => {
    await Promise.all(procs.splice(0).map((p) => p.kill('SIGKILL')));
  });
  after(async () => {
    await pool?.end();
    secrets?.remove();
    await db?.drop();
    await provider?.close();
  });

  /** Runs the mixed load over an api, an executor and a both process; checks every sample against each one's budget. */
  async function underLoad(total: (role: Role) => number | undefined): Promise<void> {
    const start = async (role: Role) => {
      const n = total(role);
      const p = await startProcess(db.conn, secrets.dir, role, n === undefined ? [] : ['--database-connections', String(n)]);
      procs.push(p);
      return p;
    };
    const [api, executor, both] = [await start('api'), await start('executor'), await start('both')];
    const budgets = new Map<string, [Role, ConnectionBudget]>(
      [api, executor, both].map((p) => [p.processId, [p.role, connectionBudget(p.role, total(p.role))]]),
    );
    const t = await provision({ url: api.url, pool, db } as unknown as TestServer, provider);
    const idle = await sampleConnections(pool, db.name);
    await new Promise((r) => setTimeout(r, 300));
    const idlePeaks = await idle.stop();

    const sampler = sampleConnections(pool, db.name);
    const load = startMixedLoad([api.url, both.url], t, { concurrency: 32 });
    await new Promise((r) => setTimeout(r, 6000));
    const summary = await load.stop();
    const check = await until(async () => {
      const c = await verifyStored(pool, provider, summary.accepted);
      return c.unfinished.length === 0 ? c : undefined;
    }, 60_000, 200);
    const peaks = await sampler.stop();

    expect(summary.errors, summary.errors.join('\n')).to.deep.equal([]);
    expect(summary.mismatches, summary.mismatches.join('\n')).to.deep.equal([]);
    expect(summary.ops.filter((o) => o.status >= 300), tally(summary.ops)).to.deep.equal([]);
    expect(check.doubleCalls).to.deep.equal([]);
    expect(check.lostAccepted).to.deep.equal([]);
    for (const [id, [role, budget]] of budgets) {
      const p = peaks.get(id);
      console.log(`      ${role} (budget ${budget.total}): idle ${describePeaks(idlePeaks.get(id))}; under load ${describePeaks(p)}`);
      expect(p, `${role} was sampled`).to.not.equal(undefined);
      expect(p!.get('total'), `${role} in total`).to.be.at.most(budget.total);
      for (const purpose of PURPOSES) expect(p!.get(purpose) ?? 0, `${role} ${purpose}`).to.be.at.most(budget[purpose]);
      for (const purpose of p!.keys()) expect([...PURPOSES, 'total'], `${role}: a connection of no budgeted purpose`).to.include(purpose);
    }
    console.log(`      load: ${summary.ops.length} calls, ${check.requests} requests`);
  }

  it('each role stays within its default budget under a mixed load', async () => {
    await underLoad(() => undefined);
  });

  it('--database-connections at each role\'s minimum bounds every process, and the load is served all the same', async () => {
    await underLoad((role) => minimumConnections(role));
  });

  it('/metrics shows the connections held and the budget, by purpose', async () => {
    const both = await startProcess(db.conn, secrets.dir, 'both', ['--database-connections', '20']);
    procs.push(both);
    const metrics = async () => {
      const text = await (await fetch(`${both.url}/metrics`)).text();
      return (name: string, purpose: string) => Number(new RegExp(`^${name}\\{purpose="${purpose}"\\} (\\d+)$`, 'm').exec(text)?.[1]);
    };
    const value = await metrics();
    const budget = connectionBudget('both', 20);
    for (const purpose of PURPOSES) expect(value('sarsen_database_connections_budget', purpose), purpose).to.equal(budget[purpose]);
    expect(value('sarsen_database_connections', 'bus')).to.equal(1);
    expect(value('sarsen_database_connections', 'main')).to.be.at.least(1);
    // What the process holds by its own count is what the server sees. Both are live counts (the
    // job queue opens its connections as it starts), so they must agree once the process settled:
    // within 15 s, and the last reading is the one compared.
    const compare = async () => {
      const own = await metrics();
      const { rows } = await pool.query<{ purpose: string; n: number }>(`SELECT purpose, n FROM (${CONNECTIONS_SQL}) c WHERE process = $2`, [db.name, both.processId]);
      return rows.filter((r) => r.purpose !== 'main').map((r) => ({ purpose: r.purpose, own: own('sarsen_database_connections', r.purpose), server: r.n }));
    };
    let last: Awaited<ReturnType<typeof compare>> = [];
    await until(async () => ((last = await compare()).every((c) => c.own === c.server) ? true : undefined), 15_000, 100).catch(() => undefined);
    for (const c of last) expect(c.own, c.purpose).to.equal(c.server);
  });
});
