// The export (issue 28, docs/storage.md): GET .../requests/export as NDJSON, every record once,
// oldest first, with payloads byte-exact against the stored ones; and `sarsen export`, a real
// child process reading it through a slow link, killed with SIGKILL halfway and run again,
// ending with the same file a run that was never killed writes (plain and gzip).
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import net from 'node:net';
import zlib from 'node:zlib';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatFrames, type Behavior, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json } from '../support/http.ts';
import { call } from '../support/control-plane.ts';
import { spawnSarsen } from '../support/child.ts';
import { runRetentionSweep } from '../../src/executor/retention.ts';

type Line = Record<string, any>;

describe('export', function () {
  this.timeout(240_000);
  let provider: FakeProvider;
  let server: TestServer;
  let t: Tenant;
  let dir: string;
  const ids: string[] = [];
  const streamedFrames = new Map<string, Buffer>();
  let swept: string;
  let untilNow: string; // after every record: fixed, so a continued export ends where a whole one does

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer({ settings: { retention_sweep_interval_ms: 86_400_000 } });
    t = await provision(server, provider);
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-export-'));
    const submit = async (body: object) => {
      const res = await rawRequest(`${t.base}/requests`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
        body: JSON.stringify({ model: 'gpt-test', ...body }),
      });
      const id = json(res).request_id as string;
      ids.push(id);
      return id;
    };
    for (let i = 0; i < 120; i++) {
      // Text the JSON escaping must carry exactly: quotes, a backslash, a line break, non-ASCII.
      await submit({ messages: [{ role: 'user', content: `record ${i}: "quoted" \\ é ✓ 😀\n${'x'.repeat(i * 300)}` }], temperature: 1.0 });
    }
    // Each answer by the prompt it answers (executions run concurrently, in no set order).
    const answer = (content: string, b: Behavior) => provider.rule((e) => (e.json?.messages?.[0]?.content === content ? b : undefined));
    for (let i = 0; i < 5; i++) {
      const frames = chatFrames([`stream ${i} `, 'ü', 'end'], { usage: true });
      answer(`stream ${i}`, { kind: 'sse', frames });
      streamedFrames.set(await submit({ messages: [{ role: 'user', content: `stream ${i}` }], stream: true }), Buffer.from(frames.join('')));
    }
    // A refusal whose body is not UTF-8: kept (and exported) as the bytes it was.
    answer('refused', { kind: 'json', status: 400, body: Buffer.from([0x7b, 0xff, 0xfe, 0x00, 0x7d]) });
    await submit({ messages: [{ role: 'user', content: 'refused' }] });
    // Records too large to read with others: a 5 MiB answer, a 4.5 MiB stream.
    answer('big answer', { kind: 'json', body: Buffer.from(JSON.stringify({ id: 'big', choices: [{ message: { content: 'y'.repeat(5 * 1024 * 1024) } }] })) });
    await submit({ messages: [{ role: 'user', content: 'big answer' }] });
    const bigFrames = Array.from({ length: 300 }, (_, i) => `data: {"i":${i},"pad":"${'z'.repeat(15_000)}"}\n\n`).concat('data: [DONE]\n\n');
    answer('big stream', { kind: 'sse', frames: bigFrames });
    streamedFrames.set(await submit({ messages: [{ role: 'user', content: 'big stream' }], stream: true }), Buffer.from(bigFrames.join('')));
    for (;;) {
      const { rows } = await server.pool.query(`SELECT count(*)::int AS n FROM sarsen.requests WHERE id = ANY($1) AND status IN ('pending', 'running')`, [ids]);
      if (rows[0].n === 0) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    // One record swept by retention: exported as its listing row, without payloads.
    swept = ids[3]!;
    await call(server.url, 'PATCH', `/${t.tenancy}/v1/namespaces/${t.namespace}`, { token: t.adminToken, body: { retention_minutes: 60 } });
    await server.pool.query(`UPDATE sarsen.requests SET finished_at = now() - interval '2 hours' WHERE id = $1`, [swept]);
    await runRetentionSweep(server);
    await call(server.url, 'PATCH', `/${t.tenancy}/v1/namespaces/${t.namespace}`, { token: t.adminToken, body: { retention_minutes: null } });
    untilNow = new Date(Date.now() + 60_000).toISOString();
  });
  after(async () => {
    await server?.close();
    await provider?.close();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  const exportText = async (query: string, key = t.key) => {
    const res = await rawRequest(`${t.base}/requests/export?${query}`, { headers: { 'x-sarsen-key': key } });
    return { status: res.status, headers: res.headers, text: res.body.toString('utf8') };
  };
  const parse = (text: string): Line[] => text.split('\n').filter((l) => l !== '').map((l) => JSON.parse(l));

  /** Each line's payloads against the stored rows, and a stream against what the provider sent (its rows hold it encoded: src/core/frame-delta.ts). */
  const expectExact = async (lines: Line[]) => {
    for (const l of lines) {
      const id = l.request_id as string;
      if (id === swept) {
        expect(l).to.include({ expired: true, stored_bytes: 0 });
        expect(l).to.not.have.property('request_body');
        continue;
      }
      const { rows } = await server.pool.query(
        `SELECT b.body, r.body AS answer
           FROM sarsen.request_bodies b LEFT JOIN sarsen.responses r ON r.request_id = b.request_id WHERE b.request_id = $1`,
        [id],
      );
      expect(l.request_body, id).to.equal(rows[0].body);
      if (rows[0].answer) expect(Buffer.from(l.response_base64, 'base64').equals(rows[0].answer), `${id} answer`).to.equal(true);
      if (l.streaming) {
        const sent = Buffer.from(l.stream_base64, 'base64');
        expect(sent.equals(streamedFrames.get(id)!), `${id} as sent`).to.equal(true);
      }
    }
  };

  it('writes every record once, oldest first, as its listing row with its payloads byte for byte', async () => {
    const res = await exportText(`with_payloads=true&until=${encodeURIComponent(untilNow)}`);
    expect(res.status).to.equal(200);
    expect(res.headers['content-type']).to.match(/^application\/x-ndjson/);
    const lines = parse(res.text);
    expect(lines.map((l) => l.request_id)).to.deep.equal([...ids].sort());
    for (const l of lines.slice(0, 10)) {
      const row = json(await rawRequest(`${t.base}/requests/${l.request_id}/summary`, { headers: { 'x-sarsen-key': t.key } }));
      const { request_body: _b, response_status: _s, response_content_type: _c, response_base64: _r, stream_base64: _f, error_status: _e, ...meta } = l;
      expect(meta).to.deep.equal(row);
    }
    expect(lines.find((l) => l.status === 'failed')).to.include({ error_status: 400, response_status: 400 });
    await expectExact(lines);
  });

  it('selects by creation time, continues after an id, and without payloads writes the listing rows', async () => {
    const all = parse((await exportText(`until=${encodeURIComponent(untilNow)}`)).text);
    expect(all).to.have.length(ids.length);
    expect(all[0]).to.not.have.property('request_body');
    const after = parse((await exportText(`after=${all[99]!.request_id}&until=${encodeURIComponent(untilNow)}`)).text);
    expect(after.map((l) => l.request_id)).to.deep.equal(all.slice(100).map((l) => l.request_id));
    const from = all[10]!.created_at as string;
    const to = all[20]!.created_at as string;
    const window = parse((await exportText(`since=${encodeURIComponent(from)}&until=${encodeURIComponent(to)}`)).text);
    expect(window.map((l) => l.request_id)).to.deep.equal(all.filter((l) => l.created_at >= from && l.created_at < to).map((l) => l.request_id));
    expect(parse((await exportText('until=0')).text)).to.deep.equal([]);
  });

  it('needs the manage grant, and refuses what it cannot read', async () => {
    const use = await t.newKey(['use']);
    const refused = await exportText('', use.key);
    expect(refused.status).to.equal(403);
    for (const bad of ['after=nonsense', 'with_payloads=yes', 'since=yesterday']) {
      const res = await exportText(bad);
      expect(res.status, bad).to.equal(400);
      expect(JSON.parse(res.text).error.code).to.equal('bad_request');
    }
  });

  /** A link that carries `bytesPerTick` each 20 ms towards the client, so an export takes seconds. */
  const slowLink = async (bytesPerTick: number): Promise<{ url: string; close(): Promise<void> }> => {
    const target = new URL(server.url);
    const sockets = new Set<net.Socket>();
    const proxy = net.createServer((client) => {
      const upstream = net.connect(Number(target.port), target.hostname);
      sockets.add(client).add(upstream);
      client.pipe(upstream);
      const queue: Buffer[] = [];
      upstream.on('data', (b) => {
        queue.push(b);
        if (queue.length > 4) upstream.pause();
      });
      const tick = setInterval(() => {
        let left = bytesPerTick;
        while (left > 0 && queue.length) {
          const b = queue.shift()!;
          const part = b.subarray(0, left);
          if (part.length < b.length) queue.unshift(b.subarray(part.length));
          client.write(part);
          left -= part.length;
        }
        if (queue.length <= 4) upstream.resume();
        if (!queue.length && upstream.readableEnded) client.end();
      }, 20);
      const done = () => {
        clearInterval(tick);
        client.destroy();
        upstream.destroy();
      };
      client.on('close', done).on('error', done);
      upstream.on('error', done);
    });
    await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
    return {
      url: `http://127.0.0.1:${(proxy.address() as net.AddressInfo).port}`,
      close: async () => {
        for (const s of sockets) s.destroy();
        await new Promise((r) => proxy.close(r));
      },
    };
  };

  for (const gz of [false, true]) {
    it(`sarsen export${gz ? ' to .gz' : ''} continues after a SIGKILL and ends with the file an unbroken run writes`, async () => {
      const expected = (await exportText(`with_payloads=true&until=${encodeURIComponent(untilNow)}`)).text;
      const out = path.join(dir, `records${gz ? '.jsonl.gz' : '.jsonl'}`);
      const args = (url: string) => ['export', '--tenancy', t.tenancy, '--namespace', t.namespace, '--with-payloads', '--until', untilNow, '--url', url, '--out', out];
      const env = { ...process.env, SARSEN_API_KEY: t.key };
      const link = await slowLink(64 * 1024);
      try {
        const first = spawnSarsen(args(link.url), env);
        // Killed once a good part is written (a .gz file grows a member of about 1 MiB at a time).
        const enough = gz ? 1 : 2 * 1024 * 1024;
        for (;;) {
          if (fs.existsSync(out) && fs.statSync(out).size >= enough) break;
          await new Promise((r) => setTimeout(r, 20));
        }
        expect((await first.kill('SIGKILL')).signal).to.equal('SIGKILL');
      } finally {
        await link.close();
      }
      const partial = fs.readFileSync(out);
      const partialText = gz ? zlib.gunzipSync(partial, { finishFlush: zlib.constants.Z_SYNC_FLUSH }).toString('utf8') : partial.toString('utf8');
      expect(partialText.length).to.be.lessThan(expected.length);

      const second = spawnSarsen(args(server.url), env);
      expect((await second.exited).code, second.output()).to.equal(0);
      expect(second.output()).to.match(/continuing .* after req_/);
      const written = gz ? zlib.gunzipSync(fs.readFileSync(out)).toString('utf8') : fs.readFileSync(out, 'utf8');
      expect(written === expected, 'the file equals an unbroken export').to.equal(true);
      await expectExact(parse(written));
    });
  }
});
