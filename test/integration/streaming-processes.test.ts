// The api/executor split in two real processes (issue 5, "Cross-process live tail"): a stream
// submitted to `sarsen --role api` is produced by `sarsen --role executor` and reaches the
// caller, and a replayer on the api process, frame by frame as it is produced (the provider
// writes each frame only once both have the one before).
import { expect } from 'chai';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { startDeployment, type Deployment, type SarsenProcess } from '../support/processes.ts';
import { until } from '../support/http.ts';
import { postStream, replayStream, withIds, bytesOf, gate, STORED_SEQ } from './streaming-support.ts';

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
    // From the fifth frame on, the provider writes each frame only once both callers of the api
    // process have the one before: frame by frame, as it is produced, or this never ends.
    const FIRST_GATED = 5;
    const gates = frames.map(() => gate());
    const waitBefore = Object.fromEntries(gates.slice(FIRST_GATED).map((g, i) => [i + FIRST_GATED, g.until]));
    provider.rule(() => ({ kind: 'sse', frames: frames.map((f) => Buffer.from(f)), waitBefore }));
    const live = postStream(t, '/chat/completions', { model: 'gpt-test', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'across processes' }] });
    await provider.waitForRequests(1);

    // While it streams, the executor process holds the lease.
    const { rows } = await d.pool.query(`SELECT id, status, lease_owner FROM sarsen.requests ORDER BY id DESC LIMIT 1`);
    const id = rows[0].id as string;
    expect(rows[0].lease_owner).to.equal(executor.owner);
    await until(async () => ((await d.pool.query(`SELECT ${STORED_SEQ}`, [id])).rows[0].stored_seq >= FIRST_GATED ? true : undefined));
    const replayer = replayStream(t, id);
    for (let i = FIRST_GATED; i < frames.length; i++) {
      await live.waitFor((text) => text === bytesOf(frames.slice(0, i)).toString('latin1'));
      await replayer.waitFor((text) => text === withIds(frames.slice(0, i)).toString('latin1'));
      gates[i]!.open();
    }

    const [liveDone, replayDone] = await Promise.all([live.done, replayer.done]);
    expect(liveDone.status).to.equal(200);
    expect(liveDone.body.equals(bytesOf(frames))).to.equal(true);
    expect(replayDone.body.equals(withIds(frames))).to.equal(true);
    const settled = await d.pool.query(`SELECT status, prompt_tokens, completion_tokens FROM sarsen.requests WHERE id = $1`, [id]);
    expect(settled.rows[0].status).to.equal('succeeded');
    expect(settled.rows[0].prompt_tokens).to.be.a('number');
    expect(provider.journal).to.have.length(1);
  });
});
