// The hand-off from acceptance to execution (AttemptRunner.runWhereAccepted): a submission's
// commit is told to claim for this process only while a slot is free, and the slot it held is
// free again once that commit claimed nothing or failed. (What a claimed attempt does once it
// starts is acceptance.test.ts's.)
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { otherProcess, type OtherProcess } from '../support/control-plane.ts';
import { createAttemptRunner, type AttemptRunner } from '../../src/executor/attempt-runner.ts';
import { createUpstream, type Upstream } from '../../src/executor/upstream.ts';
import { createChunkWriter, type ChunkWriter } from '../../src/executor/chunk-writer.ts';
import type { Acceptance } from '../../src/deps.ts';

/** A commit that attached to a live execution: it claimed nothing. */
const ATTACHED: Acceptance = { submitted: { requestId: 'req_01JTEST0000000000000000000', attached: true, status: 'running', jobId: null, cachedFrom: null }, claimed: null };

/** An acceptance commit that records the owner it was told to claim for, and settles when the test says. */
function heldCommit() {
  let settle!: { resolve: (accepted: Acceptance) => void; reject: (err: Error) => void };
  const owners: (string | null)[] = [];
  const commit = (owner: string | null) =>
    new Promise<Acceptance>((resolve, reject) => {
      owners.push(owner);
      settle = { resolve, reject };
    });
  return { commit, owners, settle: () => settle };
}

describe('run where accepted: the slot a submission holds through its commit', function () {
  this.timeout(60_000);
  let server: TestServer;
  let other: OtherProcess;
  let upstream: Upstream;
  let chunks: ChunkWriter;
  let runner: AttemptRunner;
  let owner: string;

  before(async () => {
    server = await startTestServer({ role: 'api' });
    other = await otherProcess(server);
    const { deps } = other;
    owner = deps.processId;
    upstream = createUpstream();
    chunks = createChunkWriter(deps.conn, deps.bus, owner, () => 1000);
    runner = createAttemptRunner({ ...deps, upstream, chunks }, { owner, concurrency: 1 });
  });
  after(async () => {
    await runner?.stop(0);
    await Promise.all([upstream?.close(), chunks?.close()]);
    await other?.close();
    await server?.close();
  });

  it('claims only with a free slot, and frees it when the commit attached or failed', async () => {
    const first = heldCommit();
    const firstDone = runner.runWhereAccepted(first.commit, { background: false });
    expect(first.owners).to.deep.equal([owner], 'a free slot: the commit claims for this process');

    const meanwhile = heldCommit();
    const meanwhileDone = runner.runWhereAccepted(meanwhile.commit, { background: false });
    expect(meanwhile.owners).to.deep.equal([null], 'the only slot is held by the first commit: record and enqueue only');
    meanwhile.settle().resolve(ATTACHED);
    await meanwhileDone;

    first.settle().resolve(ATTACHED);
    expect(await firstDone).to.equal(ATTACHED);

    const failing = heldCommit();
    const failingDone = runner.runWhereAccepted(failing.commit, { background: true });
    expect(failing.owners).to.deep.equal([owner], 'the attached submission gave its slot back');
    failing.settle().reject(new Error('the commit failed'));
    let thrown: unknown;
    await failingDone.catch((err: unknown) => (thrown = err));
    expect(thrown).to.be.instanceOf(Error).with.property('message', 'the commit failed');

    const last = heldCommit();
    const lastDone = runner.runWhereAccepted(last.commit, { background: false });
    expect(last.owners).to.deep.equal([owner], 'the failed submission gave its slot back');
    last.settle().resolve(ATTACHED);
    await lastDone;
  });
});
