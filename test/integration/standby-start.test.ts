// A process started while only a standby answers (docs/scaling.md "Starting during a failover"):
// it waits for a writable primary instead of exiting, given one host or several, one process or
// `--processes N`. With the schema current on the standby it binds meanwhile (/healthz 200,
// /readyz 503, everything else 503 with Retry-After, nothing written); without it, it does not
// bind. Once the standby is promoted, each becomes ready and serves. The standby is a PostgreSQL
// this test owns, restarted in standby mode after its primary is gone; test/failover/ does the
// same against a real replica pair.
import { expect } from 'chai';
import net from 'node:net';
import { startOwnedPostgres, type OwnedPostgres } from '../support/owned-postgres.ts';
import { ensureDatabase } from '../../src/db/embedded.ts';
import { makeSecretsDir, sarsenEnv, spawnSarsen, type SarsenChild, type SecretsDir } from '../support/child.ts';
import { startProcess, type FleetProcess } from '../support/fleet.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision } from '../support/tenant.ts';
import type { TestServer } from '../support/server.ts';
import type { TestDatabase } from '../support/db.ts';
import { json, rawRequest, until } from '../support/http.ts';
import { createPool, type Pool } from '../../src/db/pool.ts';

/** A port on 127.0.0.1 that nothing listens on (bound, then closed). */
async function closedPort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

const status = async (url: string) => (await fetch(url)).status;

/** A host that takes each connection and drops it at once, counting them: a waiting process's looks, made visible. */
async function droppingHost(): Promise<{ port: number; looks(): number; close(): Promise<void> }> {
  let looks = 0;
  const s = net.createServer((socket) => {
    looks++;
    socket.destroy();
  });
  await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
  return { port: (s.address() as net.AddressInfo).port, looks: () => looks, close: () => new Promise((resolve) => s.close(() => resolve())) };
}

describe('a process started while only a standby answers', function () {
  this.timeout(180_000);
  let server: OwnedPostgres;
  let db: TestDatabase;
  let secrets: SecretsDir;
  let provider: FakeProvider;
  let pool: Pool;
  let children: SarsenChild[] = [];

  before(async () => {
    provider = await startFakeProvider();
    server = await startOwnedPostgres();
    db = await server.database('sarsen_current');
    // A database the schema was never applied to, replicated as it is.
    await ensureDatabase(server.admin, 'sarsen_bare');
    secrets = makeSecretsDir(db.conn);
    await server.standby();
  });
  afterEach(async () => {
    // (The --processes primary stops its workers on SIGTERM.)
    for (const c of children) await c.kill('SIGTERM');
    for (const c of children) await c.kill('SIGKILL');
    children = [];
  });
  after(async () => {
    await pool?.end();
    secrets?.remove();
    await server?.close();
    await provider?.close();
  });

  it('waits without exiting, bound and not ready where the schema is current, then serves once the standby is promoted', async () => {
    const standby = `${db.conn.host}:${db.conn.port}`;
    // One host, one process: the api.
    const api: FleetProcess = await startProcess({ ...db.conn, host: standby }, secrets.dir, 'api');
    children.push(api);
    // Several hosts (one refusing connections), `--processes 2`: the executor.
    const executor = await startProcess({ ...db.conn, host: `127.0.0.1:${await closedPort()},${standby}` }, secrets.dir, 'executor', ['--processes', '2']);
    children.push(executor);
    // A database without the schema: nothing binds before a primary applies it.
    const bare = spawnSarsen(['--role', 'both', '--port', '0', '--host', '127.0.0.1'], sarsenEnv({ ...db.conn, host: standby, database: 'sarsen_bare' }, secrets.dir));
    children.push(bare);

    for (const p of [api, executor]) {
      expect(await status(`${p.url}/healthz`)).to.equal(200);
      expect(await status(`${p.url}/readyz`)).to.equal(503);
    }
    const refused = await rawRequest(`${api.url}/any/main/v1/requests`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    expect(refused.status).to.equal(503);
    expect(json(refused).error.code).to.equal('unavailable');
    expect(refused.headers['retry-after']).to.match(/^\d+$/);
    await bare.waitFor(/only read-only standbys answer/, 60_000);
    await executor.waitFor(/only read-only standbys answer/, 60_000);
    expect(api.output()).to.match(/only read-only standbys answer/);
    expect(bare.output()).not.to.match(/"message":"sarsen listening"/);
    // Still waiting, still not ready: no primary has appeared.
    expect(await status(`${api.url}/readyz`)).to.equal(503);
    for (const p of [api, executor, bare]) expect(p.child.exitCode, p.output().slice(-2000)).to.equal(null);

    await server.promote();
    for (const p of [api, executor]) await until(async () => ((await status(`${p.url}/readyz`)) === 200 ? true : undefined), 60_000, 100);
    const [line] = await bare.waitFor(/[^\n]*"message":"sarsen listening"[^\n]*/, 60_000);
    const bareUrl = /"url":"(http:[^"]+)"/.exec(line)![1]!;
    await until(async () => ((await status(`${bareUrl}/readyz`)) === 200 ? true : undefined), 60_000, 100);

    // The api accepts and the executor runs what it accepted.
    pool = createPool(db.conn, { max: 2, name: 'sarsen-test' });
    const t = await provision({ url: api.url, pool, db } as unknown as TestServer, provider);
    const accepted = await rawRequest(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: 'after the promotion' }] }),
    });
    expect(accepted.status).to.equal(202);
    const id = json(accepted).request_id as string;
    const record = await until(async () => {
      const r = json(await rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key } }));
      return r.status === 'succeeded' || r.status === 'failed' ? r : undefined;
    }, 60_000, 100);
    expect(record.status).to.equal('succeeded');
    for (const p of [api, executor, bare]) expect(p.child.exitCode, p.output().slice(-2000)).to.equal(null);
  });

  it('with no host answering at all, waits unbound and says so once', async () => {
    // One host refusing connections, one dropping them: every look at the hosts reaches the second.
    const dropping = await droppingHost();
    try {
      const nowhere = spawnSarsen(['--port', '0', '--host', '127.0.0.1'], sarsenEnv({ ...db.conn, host: `127.0.0.1:${await closedPort()},127.0.0.1:${dropping.port}` }, secrets.dir));
      children.push(nowhere);
      await nowhere.waitFor(/"message":"no database host answers; waiting for one"/, 60_000);
      // Past three more looks, still one line, still unbound.
      const said = dropping.looks();
      await until(async () => (dropping.looks() >= said + 3 ? true : undefined), 30_000, 50);
      expect(nowhere.output().match(/no database host answers/g)).to.have.length(1);
      expect(nowhere.output()).not.to.match(/"message":"sarsen listening"/);
      expect(nowhere.child.exitCode).to.equal(null);
    } finally {
      await dropping.close();
    }
  });

  it('refused by a server that answers (a wrong password), exits 1 with the reason instead of waiting', async () => {
    const wrong = makeSecretsDir({ ...db.conn, password: 'not-the-password' });
    try {
      // The server answers the first look with the refusal, so the exit follows a start and one
      // round trip: about half a second here, and 10 s leaves a loaded machine twenty times that.
      // A process that waited instead would look again at least every second and never exit, and
      // one that retried the refusal for a while before giving up would pass a 30 s race.
      const boundMs = 10_000;
      const started = performance.now();
      const refused = spawnSarsen(['--port', '0', '--host', '127.0.0.1'], sarsenEnv(db.conn, wrong.dir));
      children.push(refused);
      const stillWaiting = new Promise<{ code: string }>((resolve) => setTimeout(() => resolve({ code: `still running after ${boundMs / 1000} s` }), boundMs).unref());
      const { code } = await Promise.race([refused.exited, stillWaiting]);
      console.log(`      spawned to exited, refused: ${Math.round(performance.now() - started)} ms`);
      expect(code, refused.output().slice(-2000)).to.equal(1);
      expect(refused.output()).to.match(/password authentication failed/);
      expect(refused.output()).not.to.match(/waiting/);
    } finally {
      wrong.remove();
    }
  });
});
