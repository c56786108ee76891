// The api/executor split in two real processes (issue 5, "Cross-process live tail"): a stream
// submitted to `sarsen --role api` is produced by `sarsen --role executor` and reaches the
// caller, and a replayer on the api process, frame by frame as it is produced.
import { expect } from 'chai';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { startDeployment, type Deployment, type SarsenProcess } from '../support/processes.ts';
import { until } from '../support/http.ts';
import { postStream, replayStream, withIds, bytesOf, STORED_SEQ, type StreamReader } from './streaming-support.ts';

const FRAME_GAP_MS = 40;

/** Wall-clock time of each frame's arrival (frames end at a blank line in these streams). */
function frameArrivals(reader: StreamReader): number[] {
  const times: number[] = [];
  let seen = 0;
  let text = '';
  for (const a of reader.arrivals) {
    text += a.bytes.toString('latin1');
    const count = text.split('\n\n').length - 1;
    for (; seen < count; seen++) times.push(performance.timeOrigin + a.at);
  }
  return times;
}

describe('streaming across processes (role api + role executor)', function () {
  this.timeout(120_000);
  let provider: FakeProvider;
  let d: Deployment;
  let api: SarsenProcess;
  let executor: SarsenProcess;
  let t: Tenant;

  before(async () => {
    provider = await startFakeProvider();
    d = await startDeployment();
    api = await d.start('api');
    executor = await d.start('executor');
    t = await provision(d.asServer(api), provider);
  });
  after(async () => {
    for (const p of [api, executor]) {
      if (!p) continue;
      const { code } = await p.kill('SIGTERM');
      expect(code, p.output()).to.equal(0);
    }
    await d?.close();
    await provider?.close();
  });

  it('the api process answers a streaming submission live with the frames the executor process produces, and a replayer follows them as they arrive', async () => {
    const frames = chatFrames(Array.from({ length: 30 }, (_, i) => `x${i} `), { usage: true });
    // Each frame is written when the provider's clock says so; remember when.
    const sentAt: number[] = [];
    provider.rule(() => ({ kind: 'sse', frames: frames.map((f) => Buffer.from(f)), frameDelayMs: FRAME_GAP_MS }));
    const live = postStream(t, '/chat/completions', { model: 'gpt-test', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'across processes' }] });
    await provider.waitForRequests(1);
    const startedAt = provider.journal[0]!.receivedAt;
    for (let i = 0; i < frames.length; i++) sentAt.push(startedAt + i * FRAME_GAP_MS);

    // While it streams, the executor process holds the lease.
    const { rows } = await d.pool.query(`SELECT id, status, lease_owner FROM sarsen.requests ORDER BY id DESC LIMIT 1`);
    const id = rows[0].id as string;
    expect(rows[0].lease_owner).to.equal(executor.owner);
    await until(async () => ((await d.pool.query(`SELECT ${STORED_SEQ}`, [id])).rows[0].stored_seq >= 5 ? true : undefined));
    const replayer = replayStream(t, id);

    const [liveDone, replayDone] = await Promise.all([live.done, replayer.done]);
    expect(liveDone.status).to.equal(200);
    expect(liveDone.body.equals(bytesOf(frames))).to.equal(true);
    expect(replayDone.body.equals(withIds(frames))).to.equal(true);

    // Frame by frame, not all at the end: each of the later frames reached the api process's
    // callers shortly after the provider wrote it (the bus, not the 2 s backstop poll).
    for (const [name, reader] of [['live', live], ['replay', replayer]] as const) {
      const arrivals = frameArrivals(reader);
      expect(arrivals, name).to.have.length(frames.length);
      const lags = arrivals.slice(10).map((at, i) => at - sentAt[i + 10]!);
      const worst = Math.max(...lags);
      expect(worst, `${name}: frame lags ${lags.map((l) => Math.round(l)).join(',')}`).to.be.below(500);
      expect(arrivals[frames.length - 1]! - arrivals[10]!, name).to.be.above(FRAME_GAP_MS * 15);
    }
    const settled = await d.pool.query(`SELECT status, prompt_tokens, completion_tokens FROM sarsen.requests WHERE id = $1`, [id]);
    expect(settled.rows[0].status).to.equal('succeeded');
    expect(settled.rows[0].prompt_tokens).to.be.a('number');
    expect(provider.journal).to.have.length(1);
  });
});
