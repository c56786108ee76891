// Processes started in the middle of a failover (docs/scaling.md "Starting during a failover"):
// the primary node is killed while the monitor is stopped, so only the standby answers, read-only,
// for as long as the test wants. An `api` (both hosts, `--processes 2`) and an `executor` (the
// standby's address alone) start then: neither exits, both bind and answer /healthz 200 and
// /readyz 503, and the api refuses the load with 503 + Retry-After. The monitor comes back and
// promotes the standby: both become ready, and every request the api accepted is there and ends
// as it should. Run by `npm run test:failover` (it needs Debian's postgresql-<version>-auto-failover).
import { expect } from 'chai';
import pg from 'pg';
import { startHaCluster, type HaCluster } from '../support/ha-cluster.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { makeSecretsDir, type SecretsDir } from '../support/child.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import type { TestServer } from '../support/server.ts';
import { startProcess, type FleetProcess } from '../support/fleet.ts';
import { answerLoad, startMixedLoad, verifyStored, tally } from '../support/mixed-load.ts';
import { until } from '../support/http.ts';
import { createPool, type ConnectionConfig, type Pool } from '../../src/db/pool.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const progress = (line: string) => process.stderr.write(`      [standby start] ${line}\n`);
const status = (url: string) => fetch(url).then((r) => r.status, () => 0);

/** Whether anything accepts a PostgreSQL connection on `port`. */
async function answers(port: number, database: string): Promise<boolean> {
  const c = new pg.Client({ host: '127.0.0.1', port, user: 'postgres', database, connectionTimeoutMillis: 2000 });
  c.on('error', () => undefined);
  try {
    await c.connect();
    return true;
  } catch {
    return false;
  } finally {
    await c.end().catch(() => undefined);
  }
}

describe('processes started while only the standby answers', function () {
  this.timeout(600_000);
  let cluster: HaCluster;
  let provider: FakeProvider;
  let secrets: SecretsDir;
  let pool: Pool;
  let conn: ConnectionConfig;
  let t: Tenant;
  const started: FleetProcess[] = [];

  before(async () => {
    cluster = await startHaCluster();
    provider = await startFakeProvider();
    answerLoad(provider, 20);
    conn = { host: cluster.hosts, port: 5432, user: 'postgres', database: cluster.database };
    secrets = makeSecretsDir(conn);
    // A migrated database with a tenant, made by a process that is gone by the failover.
    const first = await startProcess(conn, secrets.dir, 'api');
    try {
      pool = createPool(conn, { max: 2, name: 'sarsen-test' });
      const settings = { backends_public_only: false, sweep_interval_ms: 250, lease_ms: 15000, heartbeat_ms: 2000 };
      for (const [name, value] of Object.entries(settings)) await pool.query('UPDATE sarsen.settings SET value = $2::jsonb WHERE name = $1', [name, JSON.stringify(value)]);
      t = await provision({ url: first.url, pool, db: { conn } } as unknown as TestServer, provider);
    } finally {
      await first.kill('SIGKILL');
    }
  });
  afterEach(async () => {
    for (const p of started) await p.kill('SIGTERM');
    for (const p of started) await p.kill('SIGKILL');
    await pool?.end();
    secrets?.remove();
    await provider?.close();
    await cluster?.stop();
  });

  it('starts an api and an executor that wait, bound and not ready, and serve once the standby is promoted, losing nothing they accepted', async () => {
    const primary = await cluster.healthy();
    const standby = cluster.nodes.find((n) => n !== primary)!;
    await cluster.stopMonitor();
    cluster.kill(primary);
    await until(async () => ((await answers(primary.port, cluster.database)) ? undefined : true), 30_000, 100);
    progress(`${primary.name} killed with the monitor stopped: only ${standby.name} answers, as a standby`);

    const api = await startProcess(conn, secrets.dir, 'api', ['--processes', '2']);
    started.push(api);
    const executor = await startProcess({ ...conn, host: `127.0.0.1:${standby.port}` }, secrets.dir, 'executor');
    started.push(executor);
    for (const p of [api, executor]) {
      expect(await status(`${p.url}/healthz`)).to.equal(200);
      expect(await status(`${p.url}/readyz`)).to.equal(503);
      await p.waitFor(/only read-only standbys answer/, 30_000);
    }

    // The load meets a process that waits: refused, never accepted, while no primary exists.
    const load = startMixedLoad([api.url], t, { concurrency: 8 });
    let summary;
    let writableAt = 0;
    const readyAt = new Map<FleetProcess, number>();
    try {
      await until(async () => (load.count() >= 50 ? true : undefined), 60_000, 50);
      expect(load.ops().filter((o) => o.status !== 503), 'answered before a primary existed').to.deep.equal([]);
      for (const p of [api, executor]) expect(await status(`${p.url}/readyz`)).to.equal(503);

      await cluster.startMonitor();
      writableAt = await cluster.writable(standby);
      await Promise.all(
        [api, executor].map(async (p) => {
          await until(async () => ((await status(`${p.url}/readyz`)) === 200 ? true : undefined), 60_000, 25);
          readyAt.set(p, Date.now());
        }),
      );
      await until(async () => (load.ops().filter((o) => o.status === 202 && o.endedAt >= writableAt).length >= 30 ? true : undefined), 60_000, 50);
      await sleep(1000);
    } finally {
      summary = await load.stop();
    }
    progress(`${standby.name} writable; api ready after ${readyAt.get(api)! - writableAt} ms, executor after ${readyAt.get(executor)! - writableAt} ms`);

    let check = await verifyStored(pool, provider, summary.accepted);
    for (const deadline = Date.now() + 120_000; check.unfinished.length > 0 && Date.now() < deadline; ) {
      await sleep(500);
      check = await verifyStored(pool, provider, summary.accepted);
    }
    console.log(`      ${tally(summary.ops)}; ${summary.accepted.length} accepted by 202, lost ${check.lostAccepted.length}, unfinished ${check.unfinished.length}`);

    expect(summary.errors, summary.errors.join('\n')).to.deep.equal([]);
    expect(summary.mismatches, summary.mismatches.join('\n')).to.deep.equal([]);
    expect(summary.ops.filter((o) => o.status >= 300 && o.status !== 503), 'no error but 503').to.deep.equal([]);
    expect(summary.ops.filter((o) => o.status === 503 && !o.retryAfter), '503 carries Retry-After').to.deep.equal([]);
    expect(summary.accepted.length).to.be.greaterThan(0);
    expect(check.lostAccepted, 'acknowledged requests lost').to.deep.equal([]);
    expect(check.unfinished, 'requests that never settled').to.deep.equal([]);
    expect(check.doubleCalls, 'provider calls beyond one per attempt').to.deep.equal([]);
    expect(summary.ops.filter((o) => o.stream && o.stream !== 'finished' && o.stream !== 'superseded'), 'streams cut short').to.deep.equal([]);
    for (const p of [api, executor]) expect(p.child.exitCode, `${p.role} exited:\n${p.output().slice(-3000)}`).to.equal(null);
  });
});
