// Where a request's time goes, read from spans (docs/operations.md "Tracing"): a real process
// exports its spans over OTLP, and `bench:compare --trace`'s reading of them (bench/lib/trace-report.ts)
// finds each milestone of a submission, in the order it happens, from arrival to the answer
// written; an event-loop stall in a traced process is a span of its own.
import { expect } from 'chai';
import { TracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { startDeployment, type Deployment } from '../support/processes.ts';
import { provision } from '../support/tenant.ts';
import { rawRequest, json } from '../support/http.ts';
import { startOtlpReceiver, type OtlpReceiver } from '../support/otlp-receiver.ts';
import { createTimelines } from '../../bench/lib/trace-report.ts';
import { watchPauses } from '../../src/telemetry/pauses.ts';

describe('where a request\'s time goes, from spans', function () {
  this.timeout(120_000);
  let provider: FakeProvider;
  let receiver: OtlpReceiver;
  let d: Deployment;

  before(async () => {
    provider = await startFakeProvider();
    receiver = await startOtlpReceiver();
    d = await startDeployment();
  });
  after(async () => {
    await d?.close();
    await provider?.close();
    await receiver?.close();
  });

  it('gives a synchronous request\'s milestones in order, from arrival to the answer written, with its batches\' sizes', async () => {
    const sarsen = await d.start('both', { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url, OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json', OTEL_BSP_SCHEDULE_DELAY: '50' });
    const t = await provision(d.asServer(sarsen), provider);
    const res = await rawRequest(`${t.base}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: 'trace me' }] }),
    });
    expect(res.status).to.equal(200);
    expect(json(res).choices).to.be.an('array');
    // A stopping process exports what it still holds.
    const { code } = await sarsen.kill('SIGTERM');
    expect(code, sarsen.output()).to.equal(0);

    const kept = createTimelines();
    kept.add(receiver.spans);
    // Provisioning went through the administration routes: the one submission is all there is.
    const mine = kept.timelines().filter((tl) => tl.id !== null);
    expect(mine, JSON.stringify(kept.timelines())).to.have.length(1);
    const [timeline] = mine;
    expect(timeline!.pid).to.equal(String(sarsen.child.pid));
    const stages = timeline!.stages.map((s) => s.stage);
    expect(stages.filter((s) => s !== 'claimed')).to.deep.equal([
      'arrived', 'submit', 'accept_flush', 'accept_commit', 'provider_call', 'provider_done', 'terminal_flush', 'terminal_commit', 'answered',
    ]);
    // Run where accepted: the attempt was claimed by the acceptance's own statement, so it starts
    // as that commit ends, on either side of the commit's own milestone.
    expect(stages.indexOf('claimed'), stages.join(' ')).to.be.above(stages.indexOf('accept_flush')).and.below(stages.indexOf('provider_call'));
    // Spans start on the clock their events use, not at a whole millisecond: milestones of
    // different spans compare finer than that.
    const starts = timeline!.stages.filter((s) => ['arrived', 'submit', 'claimed', 'provider_call'].includes(s.stage));
    expect(starts.some((s) => s.at % 1 !== 0), JSON.stringify(starts)).to.equal(true);
    // Batched stages name their batch's size.
    expect(timeline!.stages.find((s) => s.stage === 'accept_flush')!.batch).to.equal(1);
    expect(timeline!.stages.find((s) => s.stage === 'terminal_flush')!.batch).to.equal(1);
  });

  it('makes a stall of the event loop a span with its length', async () => {
    const exporter = new InMemorySpanExporter();
    const tracerProvider = new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] });
    const stop = watchPauses(tracerProvider.getTracer('test'));
    try {
      await new Promise((r) => setTimeout(r, 30));
      // Held for 100 ms: the watcher's next turn comes that late.
      const until = performance.now() + 100;
      while (performance.now() < until);
      await new Promise((r) => setTimeout(r, 50));
    } finally {
      stop();
    }
    const stalls = exporter.getFinishedSpans().filter((s) => s.name === 'sarsen.event_loop.stall');
    expect(stalls.map((s) => s.attributes['sarsen.pause_ms'])).to.satisfy((xs: number[]) => xs.some((x) => x >= 50));
    await tracerProvider.shutdown();
  });
});
