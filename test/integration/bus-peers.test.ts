// Request events are NOTIFYed only while another Sarsen process listens (issue 13;
// sql/migrations/015_bus_peers.sql and 017_bus_members.sql): a lone process hands them to its
// own readers in memory, and spares every commit PostgreSQL's notify lock. A second process's
// bus makes them travel again, and a bus that joins first waits for every statement that
// looked for listeners before it was visible to commit. A bus that closes leaves; one whose
// process died is forgotten by the next sweep.
import { expect } from 'chai';
import pg from 'pg';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { otherProcess } from '../support/control-plane.ts';
import { createTestDatabase, testPool } from '../support/db.ts';
import { track } from '../support/resources.ts';
import { rawRequest, json, until } from '../support/http.ts';
import { createBus } from '../../src/bus/bus.ts';
import { CHANNEL, tagChannel, type RequestEvent } from '../../src/db/events.ts';
import { PROCESS_TAG } from '../../src/core/ids.ts';

describe('request events travel only to other processes', function () {
  this.timeout(60_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let listener: pg.Client;
  const heard: string[] = [];

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer();
    t = await provision(server, provider);
    // An onlooker that is not a Sarsen bus: it hears what is sent, on the shared channel and
    // on the channel of the process that accepts this test's requests, and counts as no peer.
    listener = new pg.Client({ ...server.db.conn, application_name: 'onlooker' });
    await listener.connect();
    const channels = [CHANNEL, tagChannel(PROCESS_TAG)];
    listener.on('notification', (n) => {
      if (channels.includes(n.channel) && n.payload?.startsWith('R ')) heard.push(n.payload);
    });
    await listener.query(`LISTEN ${CHANNEL}; LISTEN "${channels[1]}"`);
  });
  after(async () => {
    await listener?.end();
    await server?.close();
    await provider?.close();
  });

  const post = (path: string, body: object) =>
    rawRequest(`${t.base}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify(body),
    });

  it('a lone process answers, streams and settles without one NOTIFY', async () => {
    provider.enqueue({ kind: 'json', body: { id: 'one', object: 'chat.completion', choices: [] } });
    expect((await post('/chat/completions', { model: 'gpt-test', messages: [{ role: 'user', content: 'alone' }] })).status).to.equal(200);
    provider.enqueue({ kind: 'sse', frames: chatFrames(['a', 'b', 'c']), frameDelayMs: 20 });
    const streamed = await post('/chat/completions', { model: 'gpt-test', stream: true, messages: [{ role: 'user', content: 'alone, streamed' }] });
    expect(streamed.status).to.equal(200);
    expect(streamed.body.toString()).to.include('data: [DONE]');
    await new Promise((r) => setTimeout(r, 300));
    expect(heard).to.deep.equal([]);
  });

  it('with a second process listening, its readers hear the first process\'s frames and answer', async () => {
    const other = await otherProcess(server);
    try {
      provider.enqueue({ kind: 'sse', frames: chatFrames(['x', 'y']), frameDelayMs: 200 });
      const accepted = await post('/requests', { model: 'gpt-test', stream: true, messages: [{ role: 'user', content: 'overheard' }] });
      const id = json(accepted).request_id as string;
      const events: RequestEvent[] = [];
      const unsubscribe = other.deps.bus.onRequest(id, (ev) => events.push(ev));
      try {
        await until(async () => (events.some((e) => e.type === 'state' && e.status === 'succeeded') ? true : undefined));
      } finally {
        unsubscribe();
      }
      expect(events.filter((e) => e.type === 'frames').length).to.be.greaterThan(0);
      expect(heard.some((p) => p.includes(id))).to.equal(true);
    } finally {
      await other.close();
    }
  });

  it('a process that died without leaving is told until the sweep forgets it', async () => {
    const answered = async (content: string) => {
      provider.enqueue({ kind: 'json', body: { id: content, object: 'chat.completion', choices: [] } });
      expect((await post('/chat/completions', { model: 'gpt-test', messages: [{ role: 'user', content }] })).status).to.equal(200);
    };
    const members = async () => (await server.pool.query<{ process_id: string }>('SELECT process_id FROM sarsen.bus_members')).rows.map((r) => r.process_id);
    // A bus that joins, then loses its connection without removing its row (its process was killed).
    const dead = new pg.Client({ ...server.db.conn, application_name: 'sarsen-bus wrk_killed' });
    await dead.connect();
    await dead.query('SELECT sarsen.bus_join()');
    await dead.end();
    heard.length = 0;
    // (Unless a sweep forgot it already: every 2 s.)
    if ((await members()).includes('wrk_killed')) {
      await answered('told while registered');
      await until(async () => (heard.length > 0 || !(await members()).includes('wrk_killed') ? true : undefined));
    }
    await until(async () => ((await members()).includes('wrk_killed') ? undefined : true));
    heard.length = 0;
    await answered('alone again');
    await new Promise((r) => setTimeout(r, 300));
    expect(heard).to.deep.equal([]);
  });
});

describe('a bus joining', function () {
  this.timeout(30_000);

  it('waits until every statement that looked for listeners before it was visible has committed', async () => {
    const db = await createTestDatabase();
    const looker = new pg.Client(db.conn);
    const release = track('client', db.name);
    const pool = testPool(db.conn, 1);
    let bus: ReturnType<typeof createBus> | null = null;
    try {
      await looker.connect();
      await looker.query('BEGIN');
      const before = await looker.query<{ peers: boolean }>(`SELECT sarsen.bus_has_peers('wrk_a') AS peers`);
      expect(before.rows[0]!.peers).to.equal(false);

      bus = createBus(db.conn, { origin: 'wrk_b' });
      let joined = false;
      const ready = bus.ready().then(() => (joined = true));
      // Its connection is visible already; it may not report itself joined while the look stands.
      await until(async () => {
        const { rows } = await pool.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'sarsen-bus wrk_b'`);
        return rows[0].n === 1 ? true : undefined;
      });
      await new Promise((r) => setTimeout(r, 500));
      expect(joined).to.equal(false);
      await looker.query('COMMIT');
      await ready;

      const peers = async (origin: string) => (await looker.query<{ peers: boolean }>(`SELECT sarsen.bus_has_peers($1) AS peers`, [origin])).rows[0]!.peers;
      expect(await peers('wrk_a')).to.equal(true);
      expect(await peers('wrk_b')).to.equal(false); // its own bus is no peer

      // A process of an earlier release names its bus connection 'sarsen-bus' and does not
      // register: the reconcile that every joining bus and every sweep runs finds it.
      const older = new pg.Client({ ...db.conn, application_name: 'sarsen-bus' });
      await older.connect();
      try {
        await looker.query('SELECT sarsen.bus_reconcile()');
        expect(await peers('wrk_b')).to.equal(true);
      } finally {
        await older.end();
      }
      await until(async () => {
        await looker.query('SELECT sarsen.bus_reconcile()');
        return (await peers('wrk_b')) ? undefined : true;
      });

      // A bus that closes removes itself at once.
      await bus.close();
      bus = null;
      expect(await peers('wrk_a')).to.equal(false);
    } finally {
      await bus?.close();
      await looker.end().catch(() => undefined);
      release();
      await pool.end();
      await db.drop();
    }
  });
});
