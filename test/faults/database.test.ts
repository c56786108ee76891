// The database link fails, not the processes (docs/reliability.md): one Sarsen process
// (`--role both`) reaches PostgreSQL through the fault proxy, under a steady mixed load
// (synchronous calls, streams, POST /requests, identical bodies at once, replays), while the link
// is partitioned, goes half-open, loses its replies, loses one commit's reply (ExecuteAndTimeout
// on acceptance, a terminal write and a chunk flush), resets, refuses, slows down and narrows.
// For every scenario: every accepted request ends exactly once with the provider's bytes, no
// provider call beyond an attempt, every caller answered, byte-exact answers and replays, the
// process still running, serving again within seconds of the link coming back, and (where a
// connection went silent) a warning that names it. A second process beside it, on a link of its
// own, takes over what the faulted one cannot finish.
import { expect } from 'chai';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';
import { makeSecretsDir, type SecretsDir } from '../support/child.ts';
import { startProcess, type FleetProcess } from '../support/fleet.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import type { TestServer } from '../support/server.ts';
import { answerLoad, startMixedLoad, verifyStored, tally, type Op } from '../support/mixed-load.ts';
import { startFaultProxy, type Fault, type FaultProxy } from '../support/fault-proxy.ts';
import { createReport, seconds } from './report.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const progress = (line: string) => process.stderr.write(`      [faults] ${line}\n`);

// Short bounds, so that a scenario takes seconds (docs/operations.md "When the network goes
// silent" gives what each one bounds); the same mechanisms run with the defaults.
const SETTINGS = {
  database_deadline_ms: 2000,
  lease_ms: 8000,
  heartbeat_ms: 1000,
  sweep_interval_ms: 500,
  synchronous_hold_ms: 40_000,
  retry_base_ms: 100,
};
// A caller gives up past the hold and every recovery: an op that ends so is a caller left waiting.
const GIVE_UP_MS = 75_000;
const LOAD = { concurrency: 8, giveUpAfterMs: GIVE_UP_MS };
// Time to serve again that the suite holds every scenario to, from the link coming back.
const SERVE_AGAIN_MS = 10_000;

type Scenario = {
  fault: string;
  /** Plays the fault; resolves at the moment the link is back (new connections work). */
  play(proxy: FaultProxy): Promise<number>;
  /** A connection went silent: a warning must name it. */
  silent: boolean;
};

/** Holds `fault` for `ms`, then lets new connections through (what it forgot stays forgotten). */
const hold = (fault: Fault, ms: number) => async (proxy: FaultProxy) => {
  proxy.set(fault);
  await sleep(ms);
  proxy.heal();
  return Date.now();
};

/** Loses the reply of the first statement named `statement`, then heals. */
const executeAndTimeout = (statement: string) => async (proxy: FaultProxy) => {
  const before = proxy.stats().fired;
  proxy.set({ kind: 'execute-and-timeout', match: statement });
  for (let i = 0; i < 100 && proxy.stats().fired === before; i++) await sleep(100);
  expect(proxy.stats().fired, `a ${statement} statement went through the proxy`).to.be.greaterThan(before);
  proxy.heal();
  return Date.now();
};

const SCENARIOS: Scenario[] = [
  { fault: 'partition 10 s, then heals (bytes held, then delivered)', play: hold({ kind: 'partition' }, 10_000), silent: true },
  { fault: 'half-open: open connections forgotten for good; new ones blackholed 3 s', play: hold({ kind: 'half-open', newConnections: 'blackhole' }, 3000), silent: true },
  { fault: 'lost replies: open connections deliver, no reply returns; new ones blackholed 3 s', play: hold({ kind: 'lost-replies', newConnections: 'blackhole' }, 3000), silent: true },
  { fault: 'ExecuteAndTimeout on acceptance (`sarsen_submit_batch`)', play: executeAndTimeout('sarsen_submit_batch'), silent: true },
  { fault: 'ExecuteAndTimeout on a terminal write (`sarsen_settle_batch`)', play: executeAndTimeout('sarsen_settle_batch'), silent: true },
  { fault: 'ExecuteAndTimeout on a chunk flush (`sarsen_store_frames`)', play: executeAndTimeout('sarsen_store_frames'), silent: true },
  { fault: 'every connection reset', play: hold({ kind: 'reset' }, 0), silent: false },
  { fault: 'new connections refused 5 s, open ones reset', play: async (proxy) => {
    proxy.set({ kind: 'reset' });
    return hold({ kind: 'refuse' }, 5000)(proxy);
  }, silent: false },
  { fault: '25 ms added each way for 8 s', play: hold({ kind: 'latency', ms: 25 }, 8000), silent: false },
  { fault: 'bandwidth 8 kB/s each way per connection for 8 s', play: hold({ kind: 'bandwidth', bytesPerSecond: 8 * 1024 }, 8000), silent: false },
];

const report = createReport('database', ['workload', 'fault', 'runs', 'accepted', 'lost', 'run twice', 'unfinished', 'longest wait', 'time to serve again']);

/** /readyz every 250 ms (a probe that waits 2 s); what it answered while `during()` held. */
function watchReadyz(url: string, during: () => boolean): { stop(): Promise<{ answered: number; unanswered: number; codes: Set<number> }> } {
  const seen = { answered: 0, unanswered: 0, codes: new Set<number>() };
  let running = true;
  const loop = (async () => {
    while (running) {
      const faulted = during();
      try {
        const res = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(2000) });
        await res.arrayBuffer();
        if (faulted) {
          seen.answered++;
          seen.codes.add(res.status);
        }
      } catch {
        if (faulted) seen.unanswered++;
      }
      await sleep(250);
    }
  })();
  return {
    async stop() {
      running = false;
      await loop;
      return seen;
    },
  };
}

/** From `backAt`, the first 2xx a caller got who started after the fault began. */
function serveAgain(ops: readonly Op[], faultAt: number, backAt: number): number | null {
  const ends = ops.filter((o) => o.status >= 200 && o.status < 300 && o.startedAt >= faultAt && o.endedAt >= backAt).map((o) => o.endedAt - backAt);
  return ends.length === 0 ? null : Math.min(...ends);
}

describe('the database link fails (fault suite)', function () {
  this.timeout(20 * 60_000);
  let provider: FakeProvider;
  let db: TestDatabase;
  let pool: ReturnType<typeof testPool>;
  let proxy: FaultProxy;
  let secrets: SecretsDir;
  const processes: FleetProcess[] = [];
  let t: Tenant;

  before(async () => {
    provider = await startFakeProvider();
    answerLoad(provider, 20);
    db = await createTestDatabase(SETTINGS);
    pool = testPool(db.conn, 2);
    proxy = await startFaultProxy({ host: db.conn.host, port: db.conn.port });
    secrets = makeSecretsDir(db.conn);
    processes.push(await startProcess({ ...db.conn, host: '127.0.0.1', port: proxy.port }, secrets.dir, 'both'));
    t = await provision({ url: processes[0]!.url, pool, db } as unknown as TestServer, provider);
  });
  after(async () => {
    report.write();
    await Promise.all(processes.map((p) => p.kill('SIGKILL')));
    await proxy?.close();
    await pool?.end();
    secrets?.remove();
    await db?.drop();
    await provider?.close();
  });

  /** Runs `s` on `faulted`'s link (`link`) under the load over `apis`, checks every promise, and reports its row; answers the requests it made. */
  const runScenario = async (s: Scenario, workload: string, apis: readonly FleetProcess[], faulted = processes[0]!, link = proxy) => {
    const warnedBefore = (faulted.output().match(/missed its deadline/g) ?? []).length;
    // (The provider's journal and the database keep every scenario's requests: each is checked again.)
    const before = (await verifyStored(pool, provider, [])).requests;
    const load = startMixedLoad(apis.map((a) => a.url), t, LOAD);
    await sleep(3000);
    const faultAt = Date.now();
    let backAt = Infinity;
    const readyz = watchReadyz(faulted.url, () => Date.now() < backAt);
    backAt = await s.play(link);
    await sleep(12_000);
    const seen = await readyz.stop();
    const summary = await load.stop();
    // Every accepted request ends (by this process or the other), under the lease rules.
    let check = await verifyStored(pool, provider, summary.accepted);
    for (let i = 0; i < 60 && check.unfinished.length > 0; i++) {
      await sleep(1000);
      check = await verifyStored(pool, provider, summary.accepted);
    }
    const unanswered = summary.ops.filter((o) => o.detail?.startsWith('no answer'));
    const serve = serveAgain(summary.ops, faultAt, backAt);
    const longest = Math.max(...summary.ops.map((o) => o.endedAt - o.startedAt));
    const warned = (faulted.output().match(/missed its deadline/g) ?? []).length - warnedBefore;
    progress(`${s.fault}: ${tally(summary.ops)}; readyz during the fault ${[...seen.codes].join('/')} (${seen.unanswered} unanswered); serving again after ${serve} ms; longest wait ${longest} ms; ${warned} deadline warnings`);
    report.add([workload, s.fault, 1, check.requests - before, check.lostAccepted.length, check.doubleCalls.length, check.unfinished.length, seconds(longest), seconds(serve)]);
    expect(check.lostAccepted, 'accepted requests lost').to.deep.equal([]);
    expect(check.doubleCalls, 'provider calls beyond the rules').to.deep.equal([]);
    expect(check.unfinished, 'requests left unfinished').to.deep.equal([]);
    expect(summary.mismatches, 'answers or replays not byte for byte').to.deep.equal([]);
    expect(unanswered.map((o) => `${o.kind} ${o.detail}`), 'callers never answered').to.deep.equal([]);
    expect(summary.ops.filter((o) => o.status === 500), 'no 500').to.deep.equal([]);
    expect(seen.unanswered, '/readyz always answered within 2 s').to.equal(0);
    expect(serve, 'a new caller served again within 10 s of the link coming back').to.be.a('number').and.at.most(SERVE_AGAIN_MS);
    if (s.silent) expect(warned, 'a warning names the connection that went silent').to.be.greaterThan(0);
    for (const p of processes) expect(p.child.exitCode, `${p.role} process still running`).to.equal(null);
    return summary;
  };

  for (const s of SCENARIOS) {
    it(`one process: ${s.fault}`, async () => {
      await runScenario(s, 'one process (`both`), mixed load, 8 callers', processes.slice(0, 1));
    });
  }

  it('two processes, one faulted past its leases: half-open for 12 s, and the other recovers what it held', async () => {
    // The second process on a link of its own; the first (the watching executor) on a healthy one.
    const link = await startFaultProxy({ host: db.conn.host, port: db.conn.port });
    const second = await startProcess({ ...db.conn, host: '127.0.0.1', port: link.port }, secrets.dir, 'both');
    processes.push(second);
    // A slow stream the second process is running when the fault begins, so that it surely holds
    // one (the load's own requests last milliseconds, and at the fault's moment it may hold none).
    const marker = `held-${Date.now()}`;
    const stopSlow = provider.rule((e) =>
      (e.json as { messages?: { content?: unknown }[] } | null)?.messages?.[0]?.content === marker
        ? { kind: 'sse', frames: Array.from({ length: 8 }, (_, i) => `data: {"choices":[{"index":0,"delta":{"content":"h${i}"}}]}\n\n`), frameDelayMs: 500 }
        : undefined,
    );
    let held = '';
    const holdOne = async () => {
      const res = await fetch(`${second.url}/${t.tenancy}/${t.namespace}/v1/requests`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
        body: JSON.stringify({ model: 'gpt-load', stream: true, messages: [{ role: 'user', content: marker }] }),
      });
      expect(res.status, 'the held request accepted').to.equal(202);
      held = ((await res.json()) as { request_id: string }).request_id;
      await provider.waitUntil(() => provider.journal.some((e) => JSON.stringify(e.json).includes(marker)), 10_000);
    };
    try {
      const s: Scenario = {
        fault: 'half-open past the lease: open connections forgotten; new ones blackholed 12 s',
        play: async (l) => {
          await holdOne();
          return hold({ kind: 'half-open', newConnections: 'blackhole' }, 12_000)(l);
        },
        silent: true,
      };
      await runScenario(s, 'two processes (`both`), the second faulted, mixed load over both', [processes[0]!, second], second, link);
      let row: { status: string; recoveries: number } | undefined;
      for (let i = 0; i < 60 && row?.status !== 'succeeded'; i++) {
        if (i > 0) await sleep(1000);
        row = (await pool.query<{ status: string; recoveries: number }>(`SELECT status, recoveries FROM sarsen.requests WHERE id = $1`, [held])).rows[0];
      }
      expect(row, 'the request the faulted process held, recovered by the other and finished').to.deep.include({ status: 'succeeded' });
      expect(row!.recoveries, 'its recoveries').to.be.greaterThan(0);
    } finally {
      stopSlow();
      await second.kill('SIGKILL');
      processes.pop();
      await link.close();
    }
  });
});
