// Surviving worker death (issue 6): real `sarsen` processes, the executor holding a stream
// killed with SIGKILL, and another executor taking the request over.
import { expect } from 'chai';
import http from 'node:http';
import { startFakeProvider, chatFrames, chatCompletionBody, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { startDeployment, type Deployment, type SarsenProcess } from '../support/processes.ts';
import { spawnSarsen, sarsenEnv, type SarsenChild } from '../support/child.ts';
import { rawRequest, json, until } from '../support/http.ts';
import { settled } from '../support/chaos.ts';
import { recountStorage } from '../../src/db/accounting.ts';

type Replayer = { text(): string; done: Promise<string>; close(): void };

/** Follows `GET /requests/{id}` as SSE, keeping everything received so far. */
function replayer(url: string, key: string, headers: Record<string, string> = {}): Replayer {
  let text = '';
  let req: http.ClientRequest;
  const done = new Promise<string>((resolve, reject) => {
    req = http.get(url, { headers: { accept: 'text/event-stream', 'x-sarsen-key': key, ...headers }, agent: false }, (res) => {
      res.setEncoding('utf8');
      res.on('data', (c: string) => (text += c));
      res.on('end', () => resolve(text));
      res.on('error', reject);
    });
    req.on('error', reject);
  });
  return { text: () => text, done, close: () => req.destroy() };
}

const stripIds = (s: string) => s.replace(/^id: \d+\n/gm, '');

describe('surviving worker death', function () {
  this.timeout(120_000);
  let provider: FakeProvider;
  let d: Deployment;
  let t: Tenant;

  before(async () => {
    provider = await startFakeProvider();
    d = await startDeployment({ sweep_interval_ms: 100, lease_ms: 5000, heartbeat_ms: 1000 });
  });
  after(async () => {
    await d?.close();
    await provider?.close();
  });

  it('SIGKILL of the executor holding a stream: another takes over, readers see superseded, the answer completes', async () => {
    const api = await d.start('api');
    const executors = [await d.start('executor'), await d.start('executor')];
    try {
      await killAndRecover(api, executors);
    } finally {
      // The survivors stop gracefully.
      for (const p of [api, ...executors]) {
        const { code, signal } = await p.kill('SIGTERM');
        if (signal !== 'SIGKILL') expect(code, p.output()).to.equal(0);
      }
    }
  });

  it('the recovered attempt goes ahead of a backlog of new work, however long that backlog is', async () => {
    provider.reset();
    const api = await d.start('api');
    // Two attempts at a time each, so new work queues up once both are full.
    const small = async (): Promise<SarsenChild & { owner: string }> => {
      const child = spawnSarsen(['--role', 'executor', '--port', '0', '--executor-concurrency', '2'], sarsenEnv(d.db.conn, d.secrets.dir));
      const [, owner] = await child.waitFor(/"owner":"(wrk_[0-9A-Z]+)"/);
      return { ...child, owner: owner! };
    };
    const executors: (SarsenChild & { owner: string })[] = [];
    try {
      const tenant = await provision(d.asServer(api), provider);
      const markerOf = (e: { json?: any }) => e.json?.messages?.[0]?.content as string | undefined;
      // A `hold-` request's first call never answers (it keeps its slot until cancelled or its
      // process dies); any other call answers at once.
      provider.rule((entry) => {
        const marker = markerOf(entry);
        if (!marker) return undefined;
        const first = !provider.journal.some((e) => markerOf(e) === marker); // (this call is not in it yet)
        return marker.startsWith('hold-') && first ? { kind: 'hang' } : { kind: 'json', body: chatCompletionBody(marker) };
      });
      const submit = async (marker: string) => {
        const res = await rawRequest(`${tenant.base}/requests`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-sarsen-key': tenant.key },
          body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: marker }] }),
        });
        expect(res.status).to.equal(202);
        return json(res).request_id as string;
      };
      const runningOn = (id: string) =>
        until(async () => (await d.pool.query(`SELECT lease_owner FROM sarsen.requests WHERE id = $1 AND status = 'running'`, [id])).rows[0]?.lease_owner as string | undefined);

      // The victim runs two held requests, then the survivor two more: both are full.
      executors.push(await small());
      const victim = [await submit('hold-v0'), await submit('hold-v1')];
      for (const id of victim) expect(await runningOn(id)).to.equal(executors[0]!.owner);
      executors.push(await small());
      const survivor = [await submit('hold-s0'), await submit('hold-s1')];
      for (const id of survivor) expect(await runningOn(id)).to.equal(executors[1]!.owner);
      const backlog = [];
      for (let i = 0; i < 8; i++) backlog.push(await submit(`backlog-${i}`));

      await executors[0]!.kill('SIGKILL');
      await until(async () => ((await d.pool.query(`SELECT count(*)::int AS n FROM sarsen.requests WHERE id = ANY($1) AND recoveries = 1`, [victim])).rows[0].n === 2 ? true : undefined));
      // The survivor gets a free slot: the recovered attempts are what it runs next.
      for (const id of survivor) {
        const res = await rawRequest(`${tenant.base}/requests/${id}/cancel`, { method: 'POST', headers: { 'x-sarsen-key': tenant.key } });
        expect(res.status, res.body.toString()).to.be.oneOf([200, 202]);
      }
      await settled(d.pool, [...victim, ...survivor, ...backlog], 60_000);
      const calls = provider.journal.map(markerOf);
      const firstRecovered = Math.min(...victim.map((_, i) => calls.lastIndexOf(`hold-v${i}`)));
      expect(firstRecovered, calls.join(', ')).to.be.greaterThan(calls.indexOf('hold-s1'));
      // Ahead of every backlog job but those the survivor's local queue (as deep as its
      // concurrency) may have fetched before the recovery.
      const ahead = calls.slice(0, firstRecovered).filter((m) => m?.startsWith('backlog-'));
      expect(ahead.length, `calls in order: ${calls.join(', ')}`).to.be.at.most(2);
    } finally {
      for (const p of [api, ...executors]) await p.kill('SIGKILL');
    }
  });

  async function killAndRecover(api: SarsenProcess, executors: SarsenProcess[]): Promise<void> {
    t = await provision(d.asServer(api), provider);

    // Each provider call streams 40 frames, 50 ms apart, numbered by the call.
    let calls = 0;
    const framesOf = new Map<number, string[]>();
    provider.rule((entry) => {
      if (entry.path !== '/v1/chat/completions') return undefined;
      const n = ++calls;
      const frames = chatFrames(Array.from({ length: 40 }, (_, i) => `call${n}-piece${i} `), { usage: true });
      framesOf.set(n, frames);
      return { kind: 'sse', frames, frameDelayMs: 50 };
    });

    const submitted = await rawRequest(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'survive' }] }),
    });
    expect(submitted.status).to.equal(202);
    const id = json(submitted).request_id as string;
    const reader = replayer(`${t.base}/requests/${id}`, t.key);

    // Let the first attempt get some frames out, then kill the process that holds it.
    await until(async () => (reader.text().match(/^id: /gm)?.length ?? 0) >= 5 || undefined);
    const { rows } = await d.pool.query(`SELECT lease_owner FROM sarsen.requests WHERE id = $1`, [id]);
    const holder = executors.find((e) => e.owner === rows[0].lease_owner);
    expect(holder, `lease owner ${rows[0].lease_owner}`).to.not.equal(undefined);
    const killedAt = Date.now();
    await holder!.kill('SIGKILL');

    const seen = await reader.done;
    expect(seen).to.match(/event: failed\ndata: \{"status":"superseded","detail":"[^"]+"\}\n\n$/);
    const beforeFailure = stripIds(seen.slice(0, seen.indexOf('event: failed')));
    expect(framesOf.get(1)!.join('').startsWith(beforeFailure)).to.equal(true);

    const record = await until(async () => {
      const r = json(await rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key } }));
      return r.status === 'succeeded' ? r : undefined;
    }, 60_000);
    expect(record.attempts).to.equal(2);
    expect(record.recoveries).to.equal(1);
    // The attempt history says why there were two: the first one's worker died.
    expect(record.attempt_log.map((e: any) => [e.attempt, e.outcome, e.backend_id])).to.deep.equal([
      [1, 'worker_died', t.backends.chat],
      [2, 'succeeded', t.backends.chat],
    ]);
    expect(record.attempt_log[1].status).to.equal(200);
    expect(provider.journal.filter((e) => e.path === '/v1/chat/completions')).to.have.length(2);
    const secondCall = provider.journal[provider.journal.length - 1]!;
    process.stderr.write(`      (SIGKILL to the new attempt's provider call: ${secondCall.receivedAt - killedAt} ms)\n`);

    // Re-opening gives the new attempt from its beginning, exactly as the provider sent it.
    const again = await replayer(`${t.base}/requests/${id}`, t.key).done;
    expect(stripIds(again)).to.equal(framesOf.get(2)!.join(''));
    const firstNewSeq = Number(/^id: (\d+)$/m.exec(again)![1]);
    expect(firstNewSeq).to.be.greaterThan(5); // sequence numbers keep increasing across attempts

    // A resume point inside the discarded attempt is answered with superseded at once.
    const stale = await replayer(`${t.base}/requests/${id}`, t.key, { 'last-event-id': '3' }).done;
    expect(stale).to.match(/^event: failed\ndata: \{"status":"superseded"/);

    // The dead attempt's frames are gone and the byte count matches what is stored.
    const stored = await d.pool.query(
      `SELECT coalesce(sum(coalesce(cardinality(frame_lengths), 1)), 0)::int AS frames, coalesce(sum(coalesce(bytes, octet_length(frames))), 0)::int AS bytes,
              min(attempt) AS attempt
         FROM sarsen.chunks WHERE request_id = $1`,
      [id],
    );
    const row = await d.pool.query(`SELECT chunk_bytes FROM sarsen.requests WHERE id = $1`, [id]);
    expect(stored.rows[0].attempt).to.equal(2);
    expect(stored.rows[0].frames).to.equal(framesOf.get(2)!.length);
    expect(row.rows[0].chunk_bytes).to.equal(stored.rows[0].bytes);
    // The namespace's storage counters followed the discard.
    const storage = json(await rawRequest(`${t.base}/storage`, { headers: { 'x-sarsen-key': t.key } }));
    const recount = await recountStorage(d.pool, t.namespaceId);
    expect(storage).to.include(recount);
  }
});
