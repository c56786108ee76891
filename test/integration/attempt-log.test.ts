// The attempt history (issue 18, part 2): GET /requests/{id} says how each attempt ended.
// (The history after a SIGKILL recovery is checked in recovery.test.ts; after a cancel, in
// cancel.test.ts.)
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json, until } from '../support/http.ts';

describe('attempt history', function () {
  this.timeout(60_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer({ settings: { retry_base_ms: 50, retry_max_ms: 200 } });
    t = await provision(server, provider);
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });
  beforeEach(() => provider.reset());

  const settledRecord = async (content: string) => {
    const res = await rawRequest(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content }] }),
    });
    const id = json(res).request_id as string;
    return until(async () => {
      const r = json(await rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key } }));
      return r.status === 'succeeded' || r.status === 'failed' ? r : undefined;
    });
  };

  it('after a 429 then a success: the refusal with its status and retry-after, then the success, each with its times and backend', async () => {
    provider.enqueue({ kind: 'refuse', status: 429, retryAfter: '0' }, { kind: 'default' });
    const record = await settledRecord('secret prompt 429');
    expect(record.status).to.equal('succeeded');
    const log = record.attempt_log;
    expect(log).to.have.length(2);
    expect(log[0]).to.include({ attempt: 1, outcome: 'retried', status: 429, retry_after: '0', backend_id: t.backends.chat });
    expect(log[1]).to.include({ attempt: 2, outcome: 'succeeded', status: 200, backend_id: t.backends.chat });
    for (const e of log) {
      expect(Date.parse(e.ended_at)).to.be.at.least(Date.parse(e.started_at));
      expect(Object.keys(e).sort()).to.satisfy((keys: string[]) => keys.every((k) => ['attempt', 'started_at', 'ended_at', 'backend_id', 'outcome', 'status', 'retry_after'].includes(k)));
    }
    expect(Date.parse(log[1].started_at)).to.be.at.least(Date.parse(log[0].ended_at));
    // No prompt, no answer, no credential in it.
    const text = JSON.stringify(log);
    for (const secret of ['secret prompt', t.chatCredential, t.key]) expect(text).to.not.include(secret);
  });

  it('after a transport failure then a refusal: the transport failure\'s message, then the refusal\'s status', async () => {
    provider.enqueue({ kind: 'drop' }, { kind: 'refuse', status: 400 });
    const record = await settledRecord('drop then 400');
    expect(record.status).to.equal('failed');
    const [first, second] = record.attempt_log;
    expect(first).to.include({ attempt: 1, outcome: 'retried' });
    expect(first.error).to.be.a('string').and.not.equal('');
    expect(first).to.not.have.property('status');
    expect(second).to.include({ attempt: 2, outcome: 'failed', status: 400 });
    expect(record.attempt_log).to.have.length(2);
  });

  it('the listing does not carry it', async () => {
    const { key } = await t.newKey(['use', 'manage']);
    await settledRecord('listed');
    const listing = json(await rawRequest(`${t.base}/requests`, { headers: { 'x-sarsen-key': key } }));
    expect(listing.data.length).to.be.above(0);
    for (const row of listing.data) expect(row).to.not.have.property('attempt_log');
  });
});
