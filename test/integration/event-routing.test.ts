// Request events go to the processes that read the request (docs/scaling.md, "Many processes
// on one primary"): the process that accepted it hears them on its own channel, a process
// replaying it live registers as its reader and hears them too while it reads, and no other
// process is told anything; the shared channel carries no request events.
import { expect } from 'chai';
import pg from 'pg';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';
import { makeSecretsDir, type SecretsDir } from '../support/child.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import type { TestServer } from '../support/server.ts';
import { startProcess, type FleetProcess } from '../support/fleet.ts';
import { rawRequest, json, until } from '../support/http.ts';
import { CHANNEL, requestChannel } from '../../src/db/events.ts';

describe('request events between processes', function () {
  this.timeout(120_000);
  let provider: FakeProvider;
  let db: TestDatabase;
  let secrets: SecretsDir;
  let pool: ReturnType<typeof testPool>;
  let onlooker: pg.Client;
  const heard: { channel: string; payload: string }[] = [];
  const procs: FleetProcess[] = [];
  let a: FleetProcess;
  let b: FleetProcess;
  let t: Tenant;

  before(async () => {
    provider = await startFakeProvider();
    db = await createTestDatabase();
    secrets = makeSecretsDir(db.conn);
    pool = testPool(db.conn, 2);
    onlooker = new pg.Client({ ...db.conn, application_name: 'onlooker' });
    await onlooker.connect();
    onlooker.on('notification', (n) => void heard.push({ channel: n.channel, payload: n.payload ?? '' }));
    await onlooker.query(`LISTEN ${CHANNEL}`);
    [a, b] = [await startProcess(db.conn, secrets.dir, 'api'), await startProcess(db.conn, secrets.dir, 'api')];
    procs.push(a, b, await startProcess(db.conn, secrets.dir, 'executor'));
    t = await provision({ url: a.url, pool, db } as unknown as TestServer, provider);
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill('SIGKILL')));
    await onlooker?.end();
    await pool?.end();
    secrets?.remove();
    await db?.drop();
    await provider?.close();
  });

  const at = (p: FleetProcess) => `${p.url}/${t.tenancy}/${t.namespace}/v1`;
  const submit = async (p: FleetProcess, content: string) => {
    const res = await rawRequest(`${at(p)}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', stream: true, messages: [{ role: 'user', content }] }),
    });
    return json(res).request_id as string;
  };
  const replay = (p: FleetProcess, id: string) => rawRequest(`${at(p)}/requests/${id}`, { headers: { 'x-sarsen-key': t.key, accept: 'text/event-stream' } });
  const readers = async (id: string) => (await pool.query<{ n: number }>('SELECT count(*)::int AS n FROM sarsen.bus_readers WHERE request_id = $1', [id])).rows[0]!.n;

  it('the accepting process hears its request\'s events on its own channel; the shared channel carries none', async () => {
    provider.enqueue({ kind: 'sse', frames: chatFrames(['one', 'two', 'three']), frameDelayMs: 100 });
    const id = await submit(a, 'heard by a');
    const own = requestChannel(id);
    await onlooker.query(`LISTEN "${own}"`);
    heard.length = 0;
    const res = await replay(a, id);
    expect(res.status).to.equal(200);
    expect(res.body.toString()).to.include('data: [DONE]');
    expect(await readers(id), 'a reads its own request unregistered').to.equal(0);
    expect(heard.filter((h) => h.payload.startsWith('R ') && h.channel === CHANNEL)).to.deep.equal([]);
    expect(heard.some((h) => h.channel === own && h.payload.includes(id))).to.equal(true);
    await onlooker.query(`UNLISTEN "${own}"`);
  });

  it('another process replaying the request live registers as its reader, hears it, and leaves', async () => {
    // b's channel, by the tag of a request b accepts.
    provider.reset();
    const bChannel = requestChannel(await submit(b, 'names b'));
    await onlooker.query(`LISTEN "${bChannel}"`);
    await provider.waitForRequests(1);
    provider.reset();
    // One set of frames for the provider and the comparison: `created` is a time in seconds.
    const frames = chatFrames(Array.from({ length: 8 }, (_, i) => `w${i}`));
    provider.enqueue({ kind: 'sse', frames, frameDelayMs: 150 });
    const id = await submit(a, 'followed by b');
    heard.length = 0;
    await provider.waitForRequests(1);
    const expected = frames.join('');
    const live = replay(b, id);
    await until(async () => ((await readers(id)) === 1 ? true : undefined));
    const res = await live;
    expect(res.status).to.equal(200);
    // Every frame arrived live through b, byte for byte (without the replay's `id:` lines).
    expect(res.body.toString().replace(/^id: \d+\n/gm, '')).to.equal(expected);
    expect(heard.some((h) => h.channel === bChannel && h.payload.includes(id)), 'b was told').to.equal(true);
    await onlooker.query(`UNLISTEN "${bChannel}"`);
    // Registration outlives the reader briefly, then goes.
    await until(async () => ((await readers(id)) === 0 ? true : undefined), 10_000);
  });
});
