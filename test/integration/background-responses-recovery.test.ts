// A background response survives its executor's death (issue 42, docs/api.md "Background
// responses"): real `sarsen` processes, the executor holding the stream killed with SIGKILL.
// A reader resuming with starting_after from the discarded attempt gets that attempt's events,
// then the dialect's error event (the SDK's ResponseErrorEvent), never the new attempt's spliced on; re-read from the start the
// stream is the new attempt's; retrieve stays in progress, then completed with the full text.
import { expect } from 'chai';
import OpenAI from 'openai';
import { startFakeProvider, responsesFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision } from '../support/tenant.ts';
import { startDeployment, type Deployment } from '../support/processes.ts';
import { until } from '../support/http.ts';
import { gate } from './streaming-support.ts';

describe('a background response survives worker death', function () {
  this.timeout(120_000);
  let provider: FakeProvider;
  let d: Deployment;

  before(async () => {
    provider = await startFakeProvider();
    d = await startDeployment({ sweep_interval_ms: 100, lease_ms: 3000, heartbeat_ms: 1000 });
  });
  after(async () => {
    await d?.close();
    await provider?.close();
  });

  it('SIGKILL mid-stream: a resumed reader is told with an error event, never spliced; re-read gives the new attempt; retrieve ends completed', async () => {
    const api = await d.start('api');
    const executors = [await d.start('executor'), await d.start('executor')];
    // The new attempt holds its stream until the retrieve below has looked, so that the retrieve
    // cannot find it ended, whatever the machine's pace.
    const second = gate();
    try {
      const t = await provision(d.asServer(api), provider);
      const textOf = (n: number) => Array.from({ length: 40 }, (_, i) => `call${n}-piece${i} `);
      let n = 0;
      provider.rule((entry) => {
        if (entry.path !== '/v1/responses') return undefined;
        n++;
        return { kind: 'sse', frames: responsesFrames(textOf(n), { id: `resp_call${n}`, messageId: `msg_call${n}` }), frameDelayMs: 50, waitBefore: n === 2 ? { 1: second.until } : undefined };
      });
      const client = new OpenAI({ baseURL: t.base, apiKey: t.key, maxRetries: 0 });

      const stream = await client.responses.create({ model: 'gpt-test', input: 'survive, in the background', background: true, stream: true });
      let responseId = '';
      for await (const ev of stream) {
        if (ev.type === 'response.created') responseId = ev.response.id;
        if (ev.sequence_number === 5) break; // the caller drops its connection
      }
      expect(responseId).to.equal('resp_call1');

      const { rows } = await d.pool.query(`SELECT id, lease_owner FROM sarsen.requests WHERE dialect = 'responses'`);
      const holder = executors.find((e) => e.owner === rows[0].lease_owner);
      expect(holder, `lease owner ${rows[0].lease_owner}`).to.not.equal(undefined);
      await holder!.kill('SIGKILL');
      const killedAt = performance.now();

      // Resuming after 5 with the dead attempt's id: its stored events, then the error event.
      const resumed = await client.responses.retrieve(responseId, { stream: true, starting_after: 5 });
      const events: { seq: number; type: string; code?: string | null; delta?: string }[] = [];
      for await (const ev of resumed) {
        events.push({ seq: ev.sequence_number, type: ev.type, code: ev.type === 'error' ? ev.code : undefined, delta: ev.type === 'response.output_text.delta' ? ev.delta : undefined });
      }
      // The SDK hands the dialect's error event over as the last event (ResponseErrorEvent).
      const last = events.pop()!;
      expect(last).to.include({ type: 'error', code: 'response_superseded' });
      // Before it, only the discarded attempt's events, in order, from 6 on: nothing of the new one.
      events.forEach((e, i) => expect(e.seq).to.equal(6 + i));
      expect(events.every((e) => e.type !== 'response.completed' && (e.delta ?? 'call1-').startsWith('call1-'))).to.equal(true);
      expect(last.seq).to.equal(6 + events.length);
      // Retrieve: still unfinished (the new attempt's, queued or running), never the dead attempt's end.
      expect((await client.responses.retrieve(responseId)).status).to.be.oneOf(['queued', 'in_progress']);
      second.open();

      // Re-read from the start: the new attempt, whole, numbered from 0.
      const again = await client.responses.retrieve(responseId, { stream: true });
      const fresh: { seq: number; delta?: string }[] = [];
      let firstEventAt = 0;
      for await (const ev of again) {
        if (fresh.length === 0) firstEventAt = performance.now();
        fresh.push({ seq: ev.sequence_number, delta: ev.type === 'response.output_text.delta' ? ev.delta : undefined });
      }
      expect(fresh.map((e) => e.seq)).to.deep.equal(fresh.map((_, i) => i));
      expect(fresh.map((e) => e.delta ?? '').join('')).to.equal(textOf(2).join(''));
      console.log(`      worker death to the re-read stream's first event: ${Math.round(firstEventAt - killedAt)} ms (lease_ms 3000)`);

      const done = await until(async () => {
        const r = await client.responses.retrieve(responseId);
        return r.status === 'completed' ? r : undefined;
      }, 60_000);
      expect(done.output_text).to.equal(textOf(2).join(''));
      // After the recovery, a resume from the dead attempt's position is the error event alone.
      const late = await client.responses.retrieve(responseId, { stream: true, starting_after: 5 });
      const lateEvents: { type: string; code?: string | null }[] = [];
      for await (const ev of late) lateEvents.push({ type: ev.type, code: ev.type === 'error' ? ev.code : undefined });
      expect(lateEvents).to.deep.equal([{ type: 'error', code: 'response_superseded' }]);
      // The new attempt's own id names the same response, and resumes within its attempt.
      const tail = await client.responses.retrieve('resp_call2', { stream: true, starting_after: 40 });
      const tailSeqs: number[] = [];
      for await (const ev of tail) tailSeqs.push(ev.sequence_number);
      expect(tailSeqs).to.deep.equal([41, 42, 43, 44, 45, 46, 47]);
      expect(provider.journal.filter((e) => e.path === '/v1/responses')).to.have.length(2);
    } finally {
      // Else a failure before it is opened leaves the new attempt's call open through the shutdown.
      second.open();
      for (const p of [api, ...executors]) {
        const { code, signal } = await p.kill('SIGTERM');
        if (signal !== 'SIGKILL') expect(code, p.output()).to.equal(0);
      }
    }
  });
});
