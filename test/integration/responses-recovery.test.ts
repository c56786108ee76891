// A Responses stream survives worker death (issue 31): real `sarsen` processes, the executor
// holding the stream killed with SIGKILL, another taking the request over. Readers of the dead
// attempt end with `superseded`; re-opened by id, the stream is the new attempt's events byte
// for byte, and its tokens come from the new attempt's response.completed.
import { expect } from 'chai';
import { startFakeProvider, responsesFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision } from '../support/tenant.ts';
import { startDeployment, type Deployment } from '../support/processes.ts';
import { rawRequest, json, until } from '../support/http.ts';
import { postStream, replayStream, stripIds, withIds, bytesOf, failedEventData } from './streaming-support.ts';

describe('a responses stream survives worker death', function () {
  this.timeout(120_000);
  let provider: FakeProvider;
  let d: Deployment;

  before(async () => {
    provider = await startFakeProvider();
    d = await startDeployment({ sweep_interval_ms: 100, lease_ms: 5000, heartbeat_ms: 1000 });
  });
  after(async () => {
    await d?.close();
    await provider?.close();
  });

  it('SIGKILL of the executor mid-stream: readers see superseded, the new attempt replays byte-exact and its tokens are counted', async () => {
    const api = await d.start('api');
    const executors = [await d.start('executor'), await d.start('executor')];
    try {
      const t = await provision(d.asServer(api), provider);
      // Each provider call streams 40 deltas, 50 ms apart, told apart by the call's number.
      const framesOf = new Map<number, string[]>();
      provider.rule((entry) => {
        if (entry.path !== '/v1/responses') return undefined;
        const n = framesOf.size + 1;
        const frames = responsesFrames(Array.from({ length: 40 }, (_, i) => `call${n}-piece${i} `), { id: `resp_call${n}`, messageId: `msg_call${n}`, inputTokens: 11 * n, outputTokens: 40 });
        framesOf.set(n, frames);
        return { kind: 'sse', frames, frameDelayMs: 50 };
      });

      const body = JSON.stringify({ model: 'gpt-test', stream: true, input: 'survive, responses' });
      const submitted = await rawRequest(`${t.base}/requests?dialect=responses`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key }, body });
      expect(submitted.status).to.equal(202);
      const id = json(submitted).request_id as string;
      // A replayer by id, and a live caller whose identical body attaches on the dialect route.
      const replayer = replayStream(t, id);
      const live = postStream(t, '/responses', body);
      await replayer.waitFor((text) => (text.match(/^id: /gm)?.length ?? 0) >= 5);
      await live.waitFor((text) => text.includes('response.output_text.delta'));

      const { rows } = await d.pool.query(`SELECT lease_owner FROM sarsen.requests WHERE id = $1`, [id]);
      const holder = executors.find((e) => e.owner === rows[0].lease_owner);
      expect(holder, `lease owner ${rows[0].lease_owner}`).to.not.equal(undefined);
      await holder!.kill('SIGKILL');

      // Both readers of the dead attempt end with superseded after a prefix of its events.
      const dead = framesOf.get(1)!.join('');
      for (const [name, reader] of [['replay', replayer], ['live', live]] as const) {
        const { body: got, status } = await reader.done;
        expect(status, name).to.equal(200);
        const text = got.toString('latin1');
        expect(failedEventData(text), name).to.include({ status: 'superseded' });
        const before = stripIds(text.slice(0, text.indexOf('event: failed'))).toString('latin1');
        expect(before.length, name).to.be.greaterThan(0);
        expect(dead.startsWith(before), name).to.equal(true);
      }

      const record = await until(async () => {
        const r = json(await rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key } }));
        return r.status === 'succeeded' ? r : undefined;
      }, 60_000);
      expect(record).to.include({ dialect: 'responses', attempts: 2, recoveries: 1 });
      expect(record.attempt_log.map((e: any) => e.outcome)).to.deep.equal(['worker_died', 'succeeded']);
      expect(provider.journal.filter((e) => e.path === '/v1/responses')).to.have.length(2);

      // Re-opened by id: the new attempt from its beginning, exactly as the provider sent it.
      const again = (await replayStream(t, id).done).body;
      expect(stripIds(again).equals(bytesOf(framesOf.get(2)!))).to.equal(true);
      const firstNewSeq = Number(/^id: (\d+)$/m.exec(again.toString())![1]);
      expect(firstNewSeq).to.be.greaterThan(5);
      expect(again.equals(withIds(framesOf.get(2)!, firstNewSeq))).to.equal(true);
      // A resume point inside the discarded attempt is answered with superseded at once.
      const stale = (await replayStream(t, id, 3).done).body.toString();
      expect(stale).to.match(/^event: failed\ndata: \{"status":"superseded"/);

      // The tokens are the new attempt's, from its response.completed.
      const summary = json(await rawRequest(`${t.base}/requests/${id}/summary`, { headers: { 'x-sarsen-key': t.key } }));
      expect(summary).to.include({ prompt_tokens: 22, completion_tokens: 40, total_tokens: 62 });
    } finally {
      for (const p of [api, ...executors]) {
        const { code, signal } = await p.kill('SIGTERM');
        if (signal !== 'SIGKILL') expect(code, p.output()).to.equal(0);
      }
    }
  });
});
