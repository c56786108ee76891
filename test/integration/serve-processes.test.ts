// `sarsen serve --processes N` (issue 30): real processes behind one port, a worker killed with
// SIGKILL replaced and its request recovered by the other, one SIGTERM stopping them all.
import { expect } from 'chai';
import net from 'node:net';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';
import { MAIN, makeSecretsDir, sarsenEnv, spawnProcess, spawnSarsen, type SarsenChild, type SecretsDir } from '../support/child.ts';
import { provision } from '../support/tenant.ts';
import { ACCEPTORS } from '../../src/http/listen.ts';
import { rawRequest, json, until } from '../support/http.ts';
import type { TestServer } from '../support/server.ts';

type Line = Record<string, unknown> & { message: string };

/** The JSON log lines printed so far (the primary relays its workers' lines whole). */
function lines(child: SarsenChild): Line[] {
  return child
    .output()
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Line);
}

/** The TCP sockets process `pid` listens with on `port` (Linux's /proc). */
function listeningSockets(pid: number, port: number): number {
  const inodes = new Set(
    readdirSync(`/proc/${pid}/fd`)
      .map((fd) => { try { return readlinkSync(`/proc/${pid}/fd/${fd}`); } catch { return ''; } })
      .map((target) => /^socket:\[(\d+)\]$/.exec(target)?.[1])
      .filter((inode): inode is string => inode !== undefined),
  );
  const portHex = port.toString(16).toUpperCase().padStart(4, '0');
  return ['/proc/net/tcp', '/proc/net/tcp6']
    .flatMap((table) => readFileSync(table, 'utf8').split('\n').slice(1))
    .map((row) => row.trim().split(/\s+/))
    .filter((cols) => cols[1]?.endsWith(`:${portHex}`) && cols[3] === '0A' && inodes.has(cols[9]!)).length;
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe('sarsen serve --processes', function () {
  this.timeout(180_000);
  let provider: FakeProvider;
  let db: TestDatabase;
  let secrets: SecretsDir;
  let pool: ReturnType<typeof testPool>;

  before(async () => {
    provider = await startFakeProvider();
    db = await createTestDatabase({ sweep_interval_ms: 100, lease_ms: 5000, heartbeat_ms: 1000 });
    secrets = makeSecretsDir(db.conn);
    pool = testPool(db.conn);
  });
  after(async () => {
    await pool?.end();
    secrets?.remove();
    await db?.drop();
    await provider?.close();
  });

  it('serves one port from two workers, replaces one killed with SIGKILL while the other recovers its request, and stops all on SIGTERM with exit 0', async () => {
    const primary = spawnSarsen(['--port', '0', '--host', '127.0.0.1', '--processes', '2'], sarsenEnv(db.conn, secrets.dir));
    try {
      await primary.waitFor(/"message":"sarsen ready"/, 90_000);
      const ready = lines(primary).find((l) => l.message === 'sarsen ready')!;
      expect(ready).to.include({ processes: 2, worker: 'primary' });
      const url = ready.url as string;
      const workerPid = new Map(lines(primary).filter((l) => l.message === 'worker started').map((l) => [l.worker_id as number, l.pid as number]));
      expect([...workerPid.keys()]).to.have.members([1, 2]);
      // Each worker is an executor of its own, its log lines naming it (the workers start in
      // either order).
      const owners = () => new Map(lines(primary).filter((l) => l.message === 'executor started').map((l) => [l.owner as string, l.worker as number]));
      await until(async () => (owners().size >= 2 ? true : undefined), 90_000);
      expect([...owners().values()]).to.have.members([1, 2]);
      // Each worker listens on the port itself, through sockets that share it, so a busy one
      // still takes a burst of callers in within a few turns (test/integration/listen.test.ts);
      // the primary holds none.
      const port = Number(new URL(url).port);
      for (const pid of workerPid.values()) expect(listeningSockets(pid, port), `worker ${pid}`).to.equal(ACCEPTORS);
      expect(listeningSockets(primary.child.pid!, port), 'the primary').to.equal(0);

      const t = await provision({ url, pool, db } as unknown as TestServer, provider);
      const submit = async (content: string) => {
        const res = await rawRequest(`${t.base}/requests`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
          body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content }] }),
        });
        expect(res.status, res.body.toString()).to.equal(202);
        return json(res).request_id as string;
      };
      const record = (id: string) => rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key } }).then(json);

      // A connection each, passed to the workers in turn: both serve, as their access-log lines say.
      const serveUntil = async (label: string, wanted: number[]) => {
        const ids: string[] = [];
        const seen = new Set<number>();
        for (let i = 0; i < 40 && !wanted.every((w) => seen.has(w)); i++) {
          const id = await submit(`${label} ${i}`);
          ids.push(id);
          const line = await until(async () => lines(primary).find((l) => l.message === 'request' && l.method === 'POST' && l.request_id === id));
          seen.add(line.worker as number);
        }
        for (const id of ids) await until(async () => ((await record(id)).status === 'succeeded' ? true : undefined));
        return seen;
      };
      expect([...(await serveUntil('turn', [1, 2]))]).to.include.members([1, 2]);

      // The next call hangs at the provider; the worker running it is killed.
      let calls = 0;
      provider.rule((entry) => (entry.path === '/v1/chat/completions' && ++calls === 1 ? { kind: 'hang' } : undefined));
      const before = provider.journal.length;
      const id = await submit('survive a worker');
      await provider.waitUntil(() => provider.journal.length > before);
      const { rows } = await pool.query<{ lease_owner: string }>('SELECT lease_owner FROM sarsen.requests WHERE id = $1', [id]);
      const victim = owners().get(rows[0]!.lease_owner);
      expect(victim, `lease owner ${rows[0]!.lease_owner}`).to.be.oneOf([1, 2]);
      const victimPid = workerPid.get(victim!)!;
      process.kill(victimPid, 'SIGKILL');

      // The other worker recovers the request; the primary starts a replacement. A read that
      // reached the victim's sockets as it died is reset, and asked again.
      const done = await until(async () => {
        const r = await record(id).catch((err: NodeJS.ErrnoException) => {
          if (err.code === 'ECONNRESET') return undefined;
          throw err;
        });
        return r?.status === 'succeeded' ? r : undefined;
      }, 60_000);
      expect(done.recoveries).to.equal(1);
      expect(done.attempt_log.map((e: { outcome: string }) => e.outcome)).to.deep.equal(['worker_died', 'succeeded']);
      await primary.waitFor(/"executor started".*"worker":3\}|"worker":3\}.*"executor started"/, 60_000);
      const exited = lines(primary).find((l) => l.message === 'worker exited: replacing it')!;
      expect(exited).to.include({ worker_id: victim, pid: victimPid, signal: 'SIGKILL' });
      const replacement = lines(primary).find((l) => l.message === 'worker started' && l.worker_id === 3)!;
      expect(alive(replacement.pid as number)).to.equal(true);
      expect((await rawRequest(`${url}/readyz`)).status).to.equal(200);
      // The replacement serves too.
      expect([...(await serveUntil('after', [3]))]).to.include(3);

      const survivors = [...workerPid.values()].filter((pid) => pid !== victimPid).concat(replacement.pid as number);
      const exit = await primary.kill('SIGTERM');
      expect(exit.code, primary.output()).to.equal(0);
      expect(lines(primary).filter((l) => l.message === 'sarsen stopped').map((l) => l.worker)).to.have.members([3 - victim!, 3, 'primary']);
      for (const pid of survivors) expect(alive(pid), `worker ${pid} still running`).to.equal(false);
    } finally {
      await primary.kill('SIGKILL');
    }
  });

  it('stops every process with exit 0 when a terminal\'s Ctrl-C reaches the whole group', async () => {
    const primary = spawnProcess(process.execPath, [MAIN, '--port', '0', '--host', '127.0.0.1', '--processes', '2'], { env: sarsenEnv(db.conn, secrets.dir), detached: true, label: 'sarsen --processes 2' });
    try {
      await primary.waitFor(/"message":"sarsen ready"/, 90_000);
      const workers = lines(primary).filter((l) => l.message === 'worker started').map((l) => l.pid as number);
      process.kill(-primary.child.pid!, 'SIGINT');
      const exit = await primary.exited;
      expect(exit.code, primary.output()).to.equal(0);
      for (const pid of workers) expect(alive(pid), `worker ${pid} still running`).to.equal(false);
      expect(lines(primary).filter((l) => l.message === 'second signal: exiting at once')).to.have.length(0);
    } finally {
      await primary.kill('SIGKILL');
    }
  });

  it('answers every connection while workers are killed, none left waiting on a dead one', async () => {
    const primary = spawnSarsen(['--port', '0', '--host', '127.0.0.1', '--processes', '2'], sarsenEnv(db.conn, secrets.dir));
    try {
      await primary.waitFor(/"message":"sarsen ready"/, 90_000);
      const { url } = lines(primary).find((l) => l.message === 'sarsen ready')! as Line & { url: string };
      // Eight callers, a new connection per request, while the oldest worker is SIGKILLed four
      // times. A connection the worker had accepted or had waiting in its sockets' queues is
      // reset with it (the kernel moves the queued ones to another worker where
      // net.ipv4.tcp_migrate_req is on); the rest go to the live worker's sockets. None may
      // wait for an answer that never comes.
      const outcomes = { answered: 0, reset: 0, hung: 0 };
      let calling = true;
      const caller = async () => {
        while (calling) {
          await rawRequest(`${url}/healthz`, { timeoutMs: 10_000 }).then(
            (res) => void (res.status === 200 ? outcomes.answered++ : outcomes.reset++),
            (err: Error) => void (/no answer within/.test(err.message) ? outcomes.hung++ : outcomes.reset++),
          );
        }
      };
      const callers = Array.from({ length: 8 }, caller);
      for (let kill = 0; kill < 4; kill++) {
        await new Promise((r) => setTimeout(r, 1500));
        const oldest = lines(primary).filter((l) => l.message === 'worker started').map((l) => l.pid as number).find(alive)!;
        const listening = () => lines(primary).filter((l) => l.message === 'sarsen listening').length;
        const before = listening();
        process.kill(oldest, 'SIGKILL');
        // Its replacement listens before the next kill, so one worker at least listens throughout
        // (with none, the port refuses connections: docs/operations.md "Processes").
        await until(async () => (listening() > before ? true : undefined), 30_000);
      }
      await new Promise((r) => setTimeout(r, 1500));
      calling = false;
      await Promise.all(callers);
      expect(outcomes.hung, JSON.stringify(outcomes)).to.equal(0);
      expect(outcomes.answered, JSON.stringify(outcomes)).to.be.greaterThan(100);
      expect(outcomes.reset, JSON.stringify(outcomes)).to.be.at.most(outcomes.answered / 100);
    } finally {
      await primary.kill('SIGKILL');
    }
  });

  // Without --processes or CTX_PROCESSES, the count comes from the database hosts
  // (docs/operations.md "Processes"). The processes are held to two CPUs, so that one per core is
  // two whatever the machine, and the same two for both hosts: only the hosts differ.
  const cpus = (/^Cpus_allowed_list:\s*(\S+)$/m.exec(readFileSync('/proc/self/status', 'utf8'))![1]!)
    .split(',')
    .flatMap((range) => {
      const [from, to = from] = range.split('-').map(Number);
      return Array.from({ length: to - from + 1 }, (_, i) => from + i);
    })
    .slice(0, 2);
  const serveByDefault = (host: string) => {
    const env = sarsenEnv({ ...db.conn, host }, secrets.dir);
    delete env.CTX_PROCESSES;
    return spawnProcess('taskset', ['-c', cpus.join(','), process.execPath, MAIN, 'serve', '--port', '0', '--host', '127.0.0.1'], { env, label: `sarsen serve (${host})` });
  };

  it('without --processes or CTX_PROCESSES, runs one process where the database hosts are this machine and one per core where they are elsewhere', async () => {
    expect(cpus, 'the CPUs this test may use').to.have.length(2);
    const local = serveByDefault('127.0.0.1');
    try {
      const [line] = await local.waitFor(/[^\n]*"message":"sarsen listening"[^\n]*/, 90_000);
      expect((await rawRequest(`${/"url":"(http:[^"]+)"/.exec(line!)![1]}/readyz`)).status).to.equal(200);
      // A cluster's primary forks every worker before any of them listens: the one listening
      // here is the process itself.
      expect(lines(local).filter((l) => l.message === 'worker started'), local.output()).to.have.length(0);
      expect(lines(local).filter((l) => l.message === 'sarsen listening').map((l) => l.worker)).to.deep.equal([undefined]);
      expect((await local.kill('SIGTERM')).code, local.output()).to.equal(0);
    } finally {
      await local.kill('SIGKILL');
    }

    // 127.0.0.1 still, spelled as the local check does not read it (it reads hosts as written,
    // resolving none): to Sarsen a host elsewhere, while the traffic stays on this machine.
    const elsewhere = serveByDefault('127.1');
    try {
      // A worker's lines name it; a process serving by itself would print its own, unnamed, and
      // never the primary's `sarsen ready`.
      const [first] = await elsewhere.waitFor(/[^\n]*"message":"sarsen listening"[^\n]*/, 90_000);
      expect((JSON.parse(first!) as Line).worker, 'the first process listening').to.be.oneOf([1, 2]);
      await elsewhere.waitFor(/"message":"sarsen ready"/, 90_000);
      // Each worker writes its own lines: the primary's may come before a worker's on a busy machine.
      for (const w of [1, 2]) await elsewhere.waitFor(new RegExp(`^(?=.*"message":"sarsen listening")(?=.*"worker":${w}[,}]).*$`, 'm'), 30_000);
      expect(lines(elsewhere).find((l) => l.message === 'sarsen ready')).to.include({ processes: 2, worker: 'primary' });
      const started = lines(elsewhere).filter((l) => l.message === 'worker started');
      expect(started.map((l) => l.worker_id), elsewhere.output()).to.have.members([1, 2]);
      for (const l of started) expect(alive(l.pid as number), `worker ${l.pid}`).to.equal(true);
      expect(lines(elsewhere).filter((l) => l.message === 'sarsen listening').map((l) => l.worker)).to.have.members([1, 2]);
      expect((await elsewhere.kill('SIGTERM')).code, elsewhere.output()).to.equal(0);
      for (const l of started) expect(alive(l.pid as number), `worker ${l.pid} still running`).to.equal(false);
    } finally {
      await elsewhere.kill('SIGKILL');
    }
  });

  it('exits 1 without starting a worker when the port is taken', async () => {
    const taken = net.createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    const { port } = taken.address() as AddressInfo;
    const primary = spawnSarsen(['--port', String(port), '--host', '127.0.0.1', '--processes', '2'], sarsenEnv(db.conn, secrets.dir));
    try {
      const exit = await primary.exited;
      expect(exit.code, primary.output()).to.equal(1);
      expect(primary.output()).to.include('EADDRINUSE');
      expect(lines(primary).filter((l) => l.message === 'worker started')).to.have.length(0);
    } finally {
      await primary.kill('SIGKILL');
      await new Promise((resolve) => taken.close(resolve));
    }
  });
});
