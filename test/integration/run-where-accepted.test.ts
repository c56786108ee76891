// The hand-off from acceptance to execution (docs/durability.md "Run where accepted"): a
// submission's commit is told to claim for this process only while a slot is free, and the slot
// it held is free again once that commit claimed nothing or failed. (What a claimed attempt does
// once it starts is acceptance.test.ts's.)
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { otherProcess, type OtherProcess } from '../support/control-plane.ts';
import { createAttemptRunner, type AttemptRunner } from '../../src/executor/attempt-runner.ts';
import { createUpstream, type Upstream } from '../../src/executor/upstream.ts';
import { createChunkWriter, type ChunkWriter } from '../../src/executor/chunk-writer.ts';
import { createSubmitter } from '../../src/http/service/submitter.ts';
import { newId } from '../../src/core/ids.ts';
import type { NewSubmission, Submitter } from '../../src/deps.ts';

/** A submission of `text`, to a backend nothing calls here (no attempt starts in these tests). */
function submission(text: string, id = newId('req')): NewSubmission {
  const body = JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: text }] });
  return {
    id,
    tenancyId: 'ten_test',
    namespaceId: 'ns_test',
    apiKeyId: 'key_test',
    backendId: 'bk_test',
    fallbackBackendIds: [],
    dialect: 'chat',
    streaming: false,
    model: 'gpt-test',
    upstreamModel: 'gpt-test',
    forwardedHeaders: [],
    hops: 0,
    body,
    identity: Buffer.from(text.padEnd(32, '.')),
    sealedCredential: null,
    limits: null,
    cache: null,
    backend: { backend_id: 'bk_test', namespace_id: 'ns_test', kind: 'chat_compat', dialect: 'chat', address: 'http://127.0.0.1:9', credential_source: 'stored', credential_sealed: null },
    callerWaits: true,
  };
}

describe('run where accepted: the slot a submission holds through its commit', function () {
  this.timeout(60_000);
  let server: TestServer;
  let other: OtherProcess;
  let upstream: Upstream;
  let chunks: ChunkWriter;
  let runner: AttemptRunner;
  let owner: string;
  let submitter: Submitter;

  before(async () => {
    server = await startTestServer({ role: 'api' });
    other = await otherProcess(server);
    const { deps } = other;
    owner = deps.processId;
    upstream = createUpstream();
    chunks = createChunkWriter(deps.conn, deps.bus, owner, () => 1000);
    runner = createAttemptRunner({ ...deps, upstream, chunks }, { owner, concurrency: 1 });
    submitter = createSubmitter(deps.conn, deps.pool, deps.settings, runner);
  });
  after(async () => {
    await submitter?.close();
    await runner?.stop(0);
    await Promise.all([upstream?.close(), chunks?.close()]);
    await other?.close();
    await server?.close();
  });

  it('claims only with a free slot, and frees it when the commit claimed nothing', () => {
    expect(runner.reserve()).to.equal(owner, 'a free slot: the commit claims for this process');
    expect(runner.reserve()).to.equal(null, 'the only slot is held by the first commit: record and enqueue only');
    runner.start(null, { callerWaits: true });
    expect(runner.reserve()).to.equal(owner, 'the commit that claimed nothing gave its slot back');
    runner.start(null, { callerWaits: true });
  });

  it('a submission holds the slot through its commit, and gives it back when it attached', async () => {
    // Recorded and enqueued by a process that does not execute: a live execution to attach to.
    const live = await other.deps.submitter.submit(submission('attach to me'));
    expect(live.attached).to.equal(false);

    const attaching = submitter.submit(submission('attach to me'));
    expect(runner.reserve()).to.equal(null, 'the slot is held while the commit is in flight');
    const attached = await attaching;
    expect(attached).to.include({ requestId: live.requestId, attached: true });
    expect(runner.reserve()).to.equal(owner, 'the attached submission gave its slot back');
    runner.start(null, { callerWaits: true });
  });

  it('gives the slot back when the commit failed', async () => {
    // The statement refuses the row (request ids start with req_): the whole commit fails.
    let thrown: unknown;
    await submitter.submit(submission('refused by the table', 'bad_id')).catch((err: unknown) => (thrown = err));
    expect(thrown).to.be.instanceOf(Error).with.property('message').that.matches(/check constraint/);
    expect(runner.reserve()).to.equal(owner, 'the failed submission gave its slot back');
    runner.start(null, { callerWaits: true });
  });
});
