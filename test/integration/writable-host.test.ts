// Several hosts in CTX_DATABASE_HOST (docs/scaling.md, "Pointing Sarsen at an HA pair"): a
// process connects to the one that takes writes, skipping one that refuses connections; while
// only a read-only server answers it writes nothing, answers 503 and says so in /readyz and in
// one log line, and carries on once a host takes writes again. A read-only database stands in
// for a standby here (default_transaction_read_only, which PostgreSQL reports as a standby's
// state is reported); test/failover/ does it with a real standby.
import { expect } from 'chai';
import net from 'node:net';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';
import { makeSecretsDir, type SecretsDir } from '../support/child.ts';
import { startProcess, type FleetProcess } from '../support/fleet.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import type { TestServer } from '../support/server.ts';
import { rawRequest, until } from '../support/http.ts';
import { writableClient } from '../../src/db/writable-host.ts';

/** A port on 127.0.0.1 that nothing listens on (bound, then closed). */
async function closedPort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

describe('several database hosts', function () {
  this.timeout(120_000);
  let db: TestDatabase;
  let secrets: SecretsDir;
  let pool: ReturnType<typeof testPool>;
  // Its own sessions stay writable whatever the database's default.
  const admin = (sql: string) => pool.query(`BEGIN READ WRITE; ${sql}; COMMIT`);
  let provider: FakeProvider;
  let p: FleetProcess;
  let t: Tenant;

  before(async () => {
    provider = await startFakeProvider();
    db = await createTestDatabase();
    secrets = makeSecretsDir(db.conn);
    pool = testPool(db.conn, 2);
    const hosts = `127.0.0.1:${await closedPort()},${db.conn.host}:${db.conn.port}`;
    p = await startProcess({ ...db.conn, host: hosts }, secrets.dir, 'both');
    t = await provision({ url: p.url, pool, db } as unknown as TestServer, provider);
  });
  after(async () => {
    await p?.kill('SIGKILL');
    await admin(`ALTER DATABASE ${db.name} RESET default_transaction_read_only`).catch(() => undefined);
    await pool?.end();
    secrets?.remove();
    await db?.drop();
    await provider?.close();
  });

  const submit = () =>
    rawRequest(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: `hosts ${Math.random()}` }] }),
    });
  const ready = async () => (await fetch(`${p.url}/readyz`)).status;
  const requests = async () => (await pool.query<{ n: number }>('SELECT count(*)::int AS n FROM sarsen.requests')).rows[0]!.n;

  it('a connection listens for its server going away from the moment it is asked for: no window in which that crashes the process', async () => {
    // In a failover a demoted host's postmaster exited while such a client was being ended
    // (the host no longer took writes), before the pool had put its own listener on it.
    const conn = { ...db.conn, host: `127.0.0.1:${await closedPort()},${db.conn.host}:${db.conn.port}` };
    const Client = writableClient(conn)!;
    const c = new Client(conn);
    const connecting = c.connect();
    expect(() => c.emit('error', new Error('terminating connection due to unexpected postmaster exit'))).to.not.throw();
    await connecting;
    expect(() => c.emit('error', new Error('terminating connection due to unexpected postmaster exit'))).to.not.throw();
    await c.end();
  });

  it('connects to the host that answers, past one that refuses', async () => {
    expect((await submit()).status).to.equal(202);
    expect(await ready()).to.equal(200);
    expect(p.output()).to.match(/"message":"writable database host found"/);
  });

  it('while only a read-only server answers, writes nothing, answers 503 and says so once; then carries on', async () => {
    await admin(`ALTER DATABASE ${db.name} SET default_transaction_read_only = on`);
    // Its connections end (a primary gone), and every new one finds the server read-only.
    await pool.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND application_name ~ '^sarsen-[a-z]+ wrk_'`, [db.name]);
    await until(async () => ((await ready()) === 503 ? true : undefined), 30_000, 100);
    const before = await requests();
    for (let i = 0; i < 3; i++) {
      const res = await submit();
      expect(res.status).to.equal(503);
      expect(res.headers['retry-after']).to.match(/^\d+$/);
    }
    expect(await requests()).to.equal(before);
    expect(p.output().match(/only read-only standbys answer/g)).to.have.length(1);

    await admin(`ALTER DATABASE ${db.name} RESET default_transaction_read_only`);
    await until(async () => ((await ready()) === 200 ? true : undefined), 30_000, 100);
    expect((await submit()).status).to.equal(202);
    expect(p.child.exitCode).to.equal(null);
  });
});
