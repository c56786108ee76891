// A primary that fails over (docs/scaling.md, "High availability"): Sarsen against a
// pg_auto_failover pair (synchronous replication) under a mixed load, through three failovers
// (the primary node killed with SIGKILL, its keeper and its postmaster, and the monitor promoting
// the standby) and one planned switchover. Every acknowledged request is there after and ends as
// it would have, held callers get their answers, live streams finish or end superseded, nothing
// answers 500, new work is refused (503 + Retry-After) only until the process reaches the new
// primary, and no Sarsen process exits. Run by `npm run test:failover` (it needs Debian's
// postgresql-<version>-auto-failover; .ci/run installs it), not by `npm test`.
import { expect } from 'chai';
import { startHaCluster, type HaCluster } from '../support/ha-cluster.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { makeSecretsDir, type SecretsDir } from '../support/child.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import type { TestServer } from '../support/server.ts';
import { startProcess, type FleetProcess } from '../support/fleet.ts';
import { answerLoad, startMixedLoad, verifyStored, tally, type MixedLoad, type Op } from '../support/mixed-load.ts';
import { until } from '../support/http.ts';
import { createPool, type ConnectionConfig, type Pool } from '../../src/db/pool.ts';

const FAILOVERS = 3;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const progress = (line: string) => process.stderr.write(`      [failover] ${line}\n`);

type Round = { kind: 'failover' | 'switchover'; from: number; to: number; writableAt: number; ops: Op[]; manager: string[] };

/** The first request each api process accepted (202) at or after `t`. */
const firstAccepted = (ops: readonly Op[], t: number) => {
  const first = new Map<number, Op>();
  for (const op of ops) {
    if (op.status !== 202 || op.endedAt < t) continue;
    const f = first.get(op.api);
    if (!f || op.endedAt < f.endedAt) first.set(op.api, op);
  }
  return first;
};

describe('a primary that fails over', function () {
  this.timeout(900_000);
  let cluster: HaCluster;
  let provider: FakeProvider;
  let secrets: SecretsDir;
  let pool: Pool;
  let conn: ConnectionConfig;
  let t: Tenant;
  const apis: FleetProcess[] = [];
  const executors: FleetProcess[] = [];

  before(async () => {
    cluster = await startHaCluster();
    provider = await startFakeProvider();
    answerLoad(provider, 20);
    conn = { host: cluster.hosts, port: 5432, user: 'postgres', database: cluster.database };
    secrets = makeSecretsDir(conn);
    const settings = { backends_public_only: false, sweep_interval_ms: 250, lease_ms: 15000, heartbeat_ms: 2000 };
    // The first process migrates; the settings are written before the others start.
    apis.push(await startProcess(conn, secrets.dir, 'api'));
    pool = createPool(conn, { max: 2, name: 'sarsen-test' });
    for (const [name, value] of Object.entries(settings)) await pool.query('UPDATE sarsen.settings SET value = $2::jsonb WHERE name = $1', [name, JSON.stringify(value)]);
    await apis[0]!.kill('SIGKILL');
    apis.length = 0;
    for (let i = 0; i < 2; i++) {
      apis.push(await startProcess(conn, secrets.dir, 'api'));
      executors.push(await startProcess(conn, secrets.dir, 'executor'));
    }
    t = await provision({ url: apis[0]!.url, pool, db: { conn } } as unknown as TestServer, provider);
  });
  // (After each: the cluster's keepers started again during the test count as its own.)
  afterEach(async () => {
    await Promise.all([...apis, ...executors].map((p) => p.kill('SIGKILL')));
    await pool?.end();
    secrets?.remove();
    await provider?.close();
    await cluster?.stop();
  });

  /** What the database holds of the requests whose answers differed (marker or request id named in each line). */
  const explain = async (lines: readonly string[]) => {
    const out: string[] = [];
    for (const line of lines.slice(0, 5)) {
      const key = /(m-[0-9a-f]+|req_[0-9A-Z]+)/.exec(line)?.[1];
      if (!key) continue;
      const { rows } = await pool.query(
        `SELECT r.id, r.status, r.attempts, r.recoveries, r.stream_first_seq, r.seq_high, r.attempt_log,
                (SELECT json_agg(json_build_array(c.last_seq, c.attempt, c.frame_lengths) ORDER BY c.last_seq) FROM sarsen.chunks c WHERE c.request_id = r.id) AS chunks
           FROM sarsen.requests r JOIN sarsen.request_bodies b ON b.request_id = r.id
          WHERE r.id = $1 OR b.body LIKE '%' || $1 || '%'`,
        [key],
      );
      out.push(`${key}: ${JSON.stringify(rows)}`);
      for (const r of rows as { id: string }[]) {
        for (const p of [...apis, ...executors]) out.push(...p.output().split('\n').filter((l) => l.includes(r.id)).map((l) => `  ${p.role}: ${l.slice(0, 400)}`));
      }
    }
    return out.join('\n');
  };

  it(`rides out ${FAILOVERS} failovers and a switchover under a mixed load`, async () => {
    const load: MixedLoad = startMixedLoad(apis.map((a) => a.url), t, { concurrency: 16 });
    const rounds: Round[] = [];
    const readyz: { at: number; status: number }[] = [];
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        const status = await fetch(`${apis[0]!.url}/readyz`).then((r) => r.status, () => 0);
        readyz.push({ at: Date.now(), status });
        await sleep(100);
      }
    })();
    /** Every api process accepts again; if one does not, what it and the database were doing. */
    const acceptingAgain = async (since: number) => {
      try {
        await until(async () => (firstAccepted(load.ops(), since).size === apis.length ? true : undefined), 60_000, 50);
      } catch {
        const activity = await pool
          .query(`SELECT application_name, state, wait_event_type, wait_event, now() - query_start AS running, left(query, 60) AS query FROM pg_stat_activity WHERE application_name LIKE 'sarsen-%' AND state <> 'idle'`)
          .then((r) => JSON.stringify(r.rows), (err: Error) => `(could not read pg_stat_activity: ${err.message})`);
        const said = apis.map((a) => a.output().split('\n').filter((l) => /"level":"(warn|error)"|writable database host/.test(l)).slice(-15).join('\n')).join('\n---\n');
        throw new Error(`an api process did not accept again within 60 s; accepted since: ${[...firstAccepted(load.ops(), since).keys()]}\nactivity: ${activity}\n${said}`);
      }
    };
    let summary;
    let watch: ReturnType<HaCluster['watch']> | null = null;
    try {
      for (let i = 0; i <= FAILOVERS; i++) {
        const primary = await cluster.healthy();
        const standby = cluster.nodes.find((n) => n !== primary)!;
        await sleep(2000);
        const from = Date.now();
        watch = cluster.watch();
        if (i < FAILOVERS) {
          cluster.kill(primary);
          const writableAt = await cluster.writable(standby);
          // Sarsen accepts again: every api process (their first 202 since).
          await acceptingAgain(writableAt);
          rounds.push({ kind: 'failover', from, to: Date.now(), writableAt, ops: [], manager: await watch.stop() });
          progress(`failover ${i + 1}: ${primary.name} killed, ${standby.name} writable after ${writableAt - from} ms, every api process accepting`);
          cluster.restart(primary); // it rejoins as the standby
        } else {
          await cluster.switchover();
          const writableAt = await cluster.writable(standby);
          await acceptingAgain(writableAt);
          rounds.push({ kind: 'switchover', from, to: Date.now(), writableAt, ops: [], manager: await watch.stop() });
          progress(`switchover: ${standby.name} writable after ${writableAt - from} ms, every api process accepting`);
        }
      }
      await cluster.healthy();
      await sleep(2000);
    } finally {
      await watch?.stop(); // (a round that threw leaves its watch running)
      summary = await load.stop();
      sampling = false;
      await sampler;
    }

    progress('load stopped; waiting for every request to settle');
    for (const r of rounds) r.ops = summary.ops.filter((o) => o.endedAt >= r.from && o.startedAt <= r.to);
    let check = await verifyStored(pool, provider, summary.accepted);
    for (const deadline = Date.now() + 120_000; check.unfinished.length > 0 && Date.now() < deadline; ) {
      await sleep(500);
      check = await verifyStored(pool, provider, summary.accepted);
    }

    for (const r of rounds) {
      const first = firstAccepted(r.ops, r.writableAt);
      const firstAt = Math.min(...[...first.values()].map((o) => o.endedAt));
      const streams = r.ops.filter((o) => o.stream);
      console.log(
        `      ${r.kind}: manager ${r.writableAt - r.from} ms (${r.kind === 'failover' ? 'kill' : 'start'} to a writable new primary), Sarsen ${firstAt - r.writableAt} ms (to the first request accepted after);`
          + ` calls ${r.ops.length}: ${r.ops.filter((o) => o.status < 300).length} answered, ${r.ops.filter((o) => o.status === 503).length} 503,`
          + ` ${r.ops.filter((o) => o.status >= 500 && o.status !== 503).length} other 5xx; streams ${streams.filter((o) => o.stream === 'finished').length} finished,`
          + ` ${streams.filter((o) => o.stream === 'superseded').length} superseded, ${streams.filter((o) => o.stream !== 'finished' && o.stream !== 'superseded').length} cut`,
      );
      for (const line of r.manager) console.log(`        ${line}`);
    }
    console.log(`      all: ${tally(summary.ops)}; ${check.requests} requests, ${summary.accepted.length} accepted by 202, lost ${check.lostAccepted.length}`);

    // What a failure message shows (each round's steps as the manager took them are printed
    // above): when the calls concerned were made, and what the api processes warned of.
    const warned = () => apis.flatMap((a) => a.output().split('\n').filter((l) => /"level":"(warn|error)"/.test(l))).slice(-30).join('\n');
    const at = (ms: number) => { const r = rounds.find((x) => ms >= x.from - 2000 && ms <= x.to); return r ? `${r.kind} +${ms - r.from} ms` : new Date(ms).toISOString(); };
    const when = (ops: readonly { api: number; at?: number; endedAt?: number }[]) => ops.slice(0, 10).map((o) => `api ${o.api} at ${at(o.at ?? o.endedAt!)}`).join('; ');
    const lost = summary.accepted.filter((a) => check.lostAccepted.includes(a.id));
    expect(check.lostAccepted, `acknowledged requests lost (${when(lost)})`).to.deep.equal([]);
    expect(summary.errors, summary.errors.join('\n')).to.deep.equal([]);
    expect(summary.mismatches, `${summary.mismatches.join('\n')}\n${await explain(summary.mismatches)}`).to.deep.equal([]);
    const faults = summary.ops.filter((o) => o.status >= 500 && o.status !== 503);
    expect(faults, `no 5xx but 503 (${when(faults)}); the api processes said:\n${faults.length ? warned() : ''}`).to.deep.equal([]);
    expect(summary.ops.filter((o) => o.status >= 300 && o.status < 500)).to.deep.equal([]);
    expect(summary.ops.filter((o) => o.status === 503 && !o.retryAfter), '503 carries Retry-After').to.deep.equal([]);
    // Refused only until the process reached the new primary: no 503 once it accepted again.
    for (const r of rounds) {
      const first = firstAccepted(r.ops, r.writableAt);
      const late = r.ops.filter((o) => o.status === 503 && first.has(o.api) && o.startedAt > first.get(o.api)!.endedAt);
      expect(late, `${r.kind}: refused after accepting again`).to.deep.equal([]);
    }
    const switchover = rounds.find((r) => r.kind === 'switchover')!;
    expect(switchover.ops.filter((o) => o.status >= 300 && o.status !== 503), 'switchover: no error but 503').to.deep.equal([]);
    expect(summary.ops.filter((o) => o.stream && o.stream !== 'finished' && o.stream !== 'superseded'), 'streams cut short').to.deep.equal([]);
    const logs = () => executors.map((e) => e.output().split('\n').filter((l) => /job queue|graphile|"level":"(warn|error)"/.test(l)).slice(-20).join('\n')).join('\n---\n');
    expect(check.unfinished, `requests that never settled; the executors said:\n${check.unfinished.length ? logs() : ''}`).to.deep.equal([]);
    expect(check.doubleCalls, 'provider calls beyond one per attempt').to.deep.equal([]);
    // /readyz said so while no primary took writes, and is ready again.
    expect(readyz.some((s) => s.status === 503)).to.equal(true);
    expect(readyz.at(-1)?.status).to.equal(200);
    // One line, per process, said the database answered only as a standby meanwhile.
    expect([...apis, ...executors].some((p) => /only read-only standbys answer/.test(p.output()))).to.equal(true);
    for (const p of [...apis, ...executors]) expect(p.child.exitCode, `${p.role} exited:\n${p.output().slice(-3000)}`).to.equal(null);
  });
});
