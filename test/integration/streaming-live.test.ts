// Live streams shared between callers: attaching an identical streaming body while it runs and
// after it succeeded, several replayers of one live stream, and keep-alive comments on an idle
// replay.
import { expect } from 'chai';
import express from 'express';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json, until } from '../support/http.ts';
import { postStream, replayStream, openStream, withIds, bytesOf, query, requestIdByMarker, gate, STORED_SEQ } from './streaming-support.ts';
import { replay } from '../../src/http/service/streams.ts';
import { readRecord } from '../../src/db/requests.ts';
import { createKeyring } from '../../src/core/sealing.ts';
import type { BaseDeps } from '../../src/deps.ts';

describe('streaming: attaching, shared replay, keep-alive', function () {
  this.timeout(60_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let unique = 0;
  const marker = () => `live-${process.pid}-${++unique}`;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer();
    t = await provision(server, provider);
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });
  beforeEach(() => provider.reset());

  const seqHigh = async (id: string) =>
    (await query<{ stored_seq: number; status: string }>(server.db, `SELECT ${STORED_SEQ}, status FROM sarsen.requests WHERE id = $1`, [id]))[0]!;
  const idOf = (m: string) => until(async () => requestIdByMarker(server.db, m).catch(() => undefined));

  it('an identical streaming body while running replays the stored frames, then live-tails; after success it replays them; one provider call', async () => {
    const m = marker();
    const frames = chatFrames(Array.from({ length: 30 }, (_, i) => `t${i} `));
    // The provider stops after ten frames until the second caller has them: those came from storage.
    const rest = gate();
    provider.enqueue({ kind: 'sse', frames, frameDelayMs: 5, waitBefore: { 10: rest.until } });
    const body = { model: 'gpt-test', stream: true, messages: [{ role: 'user', content: m }] };
    const first = postStream(t, '/chat/completions', body);
    const id = await idOf(m);
    await until(async () => ((await seqHigh(id)).stored_seq >= 10 ? true : undefined));
    // The same body with its keys in another order and other whitespace: the same request.
    const reordered = JSON.stringify({ messages: body.messages, stream: true, model: 'gpt-test' }, null, 1);
    const second = postStream(t, '/chat/completions', reordered);
    await second.waitFor((s) => s.split('\n\n').length > 10);
    expect(second.bytes().equals(bytesOf(frames.slice(0, 10))), 'the stored ten, while the provider waits').to.equal(true);
    expect((await seqHigh(id)).status).to.equal('running');
    const storedCount = second.arrivals.length;
    rest.open();
    const [a, b] = await Promise.all([first.done, second.done]);
    expect(a.body.equals(bytesOf(frames))).to.equal(true);
    expect(b.status).to.equal(200);
    expect(b.headers['content-type']).to.match(/^text\/event-stream/);
    expect(b.body.equals(bytesOf(frames))).to.equal(true);
    // The rest came live: written by the provider only after the gate opened.
    expect(second.arrivals.length, 'live arrivals after the stored frames').to.be.greaterThan(storedCount);
    const third = await postStream(t, '/chat/completions', body).done;
    expect(third.status).to.equal(200);
    expect(third.body.equals(bytesOf(frames))).to.equal(true);
    const viaRequests = json(await rawRequest(`${t.base}/requests`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key }, body: JSON.stringify(body) }));
    expect(viaRequests).to.deep.equal({ request_id: id, status: 'succeeded' });
    expect(provider.journal).to.have.length(1);
  });

  it('an identical streaming body after a failure is a new request: a second provider call and fresh frames', async () => {
    const m = marker();
    const body = { model: 'gpt-test', stream: true, messages: [{ role: 'user', content: m }] };
    const broken = chatFrames(['first', ' try', ' dies']);
    const good = chatFrames(['second', ' try']);
    provider.enqueue({ kind: 'sse', frames: broken, frameDelayMs: 5, dropAfter: 2 }, { kind: 'sse', frames: good });
    const failed = await postStream(t, '/chat/completions', body).done;
    expect(failed.body.toString()).to.match(/event: failed\n/);
    const again = await postStream(t, '/chat/completions', body).done;
    expect(again.body.equals(bytesOf(good))).to.equal(true);
    expect(provider.journal).to.have.length(2);
    const ids = await query<{ id: string; status: string }>(
      server.db,
      `SELECT q.id, q.status FROM sarsen.requests q JOIN sarsen.request_bodies b ON b.request_id = q.id WHERE b.body LIKE $1 ORDER BY q.id`,
      [`%${m}%`],
    );
    expect(ids.map((r) => r.status)).to.deep.equal(['failed', 'succeeded']);
  });

  it('three replayers of one live stream, joining at different moments, see identical bytes', async () => {
    const frames = chatFrames(Array.from({ length: 40 }, (_, i) => `shared${i} `), { lineEnding: '\r\n' });
    // The provider waits at frames 10 and 25 until the replayers joined so far have what it sent.
    const [at10, at25] = [gate(), gate()];
    provider.enqueue({ kind: 'sse', frames, frameDelayMs: 5, waitBefore: { 10: at10.until, 25: at25.until } });
    const res = await rawRequest(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', stream: true, messages: [{ role: 'user', content: marker() }] }),
    });
    const id = json(res).request_id as string;
    const readers = [replayStream(t, id)];
    const upTo = async (n: number) => {
      const sent = withIds(frames.slice(0, n)).toString('latin1');
      for (const r of readers) await r.waitFor((text) => text === sent);
    };
    await until(async () => ((await seqHigh(id)).stored_seq >= 10 ? true : undefined));
    readers.push(replayStream(t, id));
    await upTo(10);
    at10.open();
    await until(async () => ((await seqHigh(id)).stored_seq >= 25 ? true : undefined));
    readers.push(replayStream(t, id));
    // Each replayer has exactly what the provider sent so far, while it waits: they follow it live.
    await upTo(25);
    at25.open();
    const done = await Promise.all(readers.map((r) => r.done));
    for (const [i, d] of done.entries()) {
      expect(d.complete, `replayer ${i}`).to.equal(true);
      expect(d.body.equals(done[0]!.body), `replayer ${i}`).to.equal(true);
    }
    expect(done[0]!.body.equals(withIds(frames))).to.equal(true);
  });

  it('an idle replay receives keep-alive comments without ids, between the frames it replays', async () => {
    // The route's interval is 15 s; `replay` itself is mounted here with a short one.
    const deps: BaseDeps = Object.freeze({
      processId: 'wrk_replay_test',
      conn: server.db.conn,
      pool: server.pool,
      bus: server.bus,
      settings: server.settings,
      secrets: server.secrets,
      serve: { role: 'api' as const, credentialPassthrough: false, port: 0, host: '127.0.0.1', executorConcurrency: 1 },
      keyring: createKeyring([{ version: 1, secret: server.secrets.credentialKey }]),
    });
    const app = express();
    app.get('/replay/:id', async (req, res) => {
      const record = await readRecord(server.pool, t.namespaceId, String(req.params.id));
      await replay(deps, req, res, { id: record!.id, namespaceId: record!.namespace_id, streaming: true }, 100);
    });
    const listener = http.createServer(app).listen(0, '127.0.0.1');
    await new Promise((r) => listener.once('listening', r));
    try {
      const frames = chatFrames(['slow', 'ly']);
      // Each frame waits until the reader has had two keep-alives since the last one.
      const gates = frames.map(() => gate());
      provider.enqueue({ kind: 'sse', frames, waitBefore: Object.fromEntries(gates.map((g, i) => [i, g.until])) });
      const res = await rawRequest(`${t.base}/requests`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
        body: JSON.stringify({ model: 'gpt-test', stream: true, messages: [{ role: 'user', content: marker() }] }),
      });
      const id = json(res).request_id as string;
      const { port } = listener.address() as AddressInfo;
      const reader = openStream(`http://127.0.0.1:${port}/replay/${id}`, { headers: { accept: 'text/event-stream' } });
      const keepAlivesSinceFrame = (text: string) => text.slice(Math.max(0, text.lastIndexOf('id: '))).split(': keep-alive\n\n').length - 1;
      for (const [i, g] of gates.entries()) {
        await reader.waitFor((text) => keepAlivesSinceFrame(text) >= 2);
        g.open();
        await reader.waitFor((text) => (text.match(/^id: /gm)?.length ?? 0) === i + 1);
      }
      const out = (await reader.done).body.toString();
      expect(out.replaceAll(': keep-alive\n\n', '')).to.equal(withIds(frames).toString());
      // Each comment stands alone: never after an `id:` line, never inside a frame.
      for (const piece of out.split(/(?<=\n\n)/)) {
        if (piece.startsWith(':')) expect(piece).to.equal(': keep-alive\n\n');
        else expect(piece).to.match(/^id: \d+\ndata: /);
      }
    } finally {
      await new Promise((r) => listener.close(r));
    }
  });
});
