// Surviving worker death (issue 6): real `sarsen` processes, the executor holding a stream
// killed with SIGKILL, and another executor taking the request over.
import { expect } from 'chai';
import http from 'node:http';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { startDeployment, type Deployment, type SarsenProcess } from '../support/processes.ts';
import { rawRequest, json, until } from '../support/http.ts';
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
      `SELECT coalesce(sum(coalesce(cardinality(frame_lengths), 1)), 0)::int AS frames, coalesce(sum(octet_length(frames)), 0)::int AS bytes,
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
