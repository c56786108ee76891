// Fallback backends (issue 18, part 3): a rule's fallback_backend_ids are tried in order after
// a retryable failure on the backend before, within max_attempts; the record, the listing and
// the attempt log name the backends.
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { call } from '../support/control-plane.ts';
import { rawRequest, json } from '../support/http.ts';

describe('fallback backends', function () {
  this.timeout(60_000);
  let server: TestServer;
  let primary: FakeProvider;
  let second: FakeProvider;
  let t: Tenant;
  let dead: string;
  let backup: string;
  let unique = 0;

  const admin = (method: string, path: string, body?: unknown) =>
    call(server.url, method, `/${t.tenancy}/v1/namespaces/${t.namespace}${path}`, { token: t.adminToken, body });
  const backend = async (name: string, address: string, kind = 'chat_compat', extra: object = {}) => {
    const res = await admin('POST', '/backends', { name, kind, address, credential: kind === 'chat_compat' ? 'sk-fallback-test' : undefined, ...extra });
    expect(res.status, res.text).to.equal(201);
    return res.body.backend_id as string;
  };
  const ask = (model: string) =>
    rawRequest(`${t.base}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model, messages: [{ role: 'user', content: `fallback ${++unique}` }] }),
    });
  const recordOf = async (model: string) => {
    const listing = json(await rawRequest(`${t.base}/requests?limit=50`, { headers: { 'x-sarsen-key': t.key } }));
    const row = listing.data.find((r: any) => r.model === model);
    const record = json(await rawRequest(`${t.base}/requests/${row.request_id}`, { headers: { 'x-sarsen-key': t.key } }));
    return { row, record };
  };

  before(async () => {
    primary = await startFakeProvider();
    second = await startFakeProvider();
    server = await startTestServer({ settings: { retry_base_ms: 50, retry_max_ms: 200, max_attempts: 3 } });
    t = await provision(server, primary);
    // A port nothing listens on: every call to it is refused.
    const closed = await startFakeProvider();
    const deadUrl = closed.url;
    await closed.close();
    dead = await backend('dead', `${deadUrl}/v1`);
    backup = await backend('backup', `${second.url}/v1`);
    for (const [model, from, fallbacks] of [
      ['dead-primary', dead, [backup]],
      ['overloaded', t.backends.chat, [backup]],
    ] as const) {
      const res = await admin('POST', '/routing-rules', { model, backend_id: from, fallback_backend_ids: fallbacks });
      expect(res.status, res.text).to.equal(201);
      expect(res.body.fallback_backend_ids).to.deep.equal(fallbacks);
    }
  });
  after(async () => {
    await server?.close();
    await primary?.close();
    await second?.close();
  });
  beforeEach(() => {
    primary.reset();
    second.reset();
  });

  it('after a dead primary, the fallback answers; record, listing and attempt log name the backends', async () => {
    const res = await ask('dead-primary');
    expect(res.status, res.body.toString()).to.equal(200);
    expect(second.journal).to.have.length(1);
    const { row, record } = await recordOf('dead-primary');
    expect(row.backend_id).to.equal(backup);
    expect(record.backend_id).to.equal(backup);
    expect(record.attempt_log.map((e: any) => [e.attempt, e.outcome, e.backend_id])).to.deep.equal([
      [1, 'retried', dead],
      [2, 'succeeded', backup],
    ]);
    expect(record.attempt_log[0].error).to.be.a('string');
  });

  it('after a 529, the fallback answers', async () => {
    primary.enqueue({ kind: 'refuse', status: 529 });
    const res = await ask('overloaded');
    expect(res.status).to.equal(200);
    expect(primary.journal).to.have.length(1);
    expect(second.journal).to.have.length(1);
    const { record } = await recordOf('overloaded');
    expect(record.attempt_log.map((e: any) => [e.outcome, e.status, e.backend_id])).to.deep.equal([
      ['retried', 529, t.backends.chat],
      ['succeeded', 200, backup],
    ]);
  });

  it('a Responses request after a 503: the fallback answers, called at its own address + /responses', async () => {
    primary.enqueue({ kind: 'refuse', status: 503 });
    const body = { model: 'overloaded', input: `fallback ${++unique}` };
    const res = await rawRequest(`${t.base}/responses`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify(body),
    });
    expect(res.status, res.body.toString()).to.equal(200);
    expect(json(res).object).to.equal('response');
    expect(primary.journal.map((e) => e.path)).to.deep.equal(['/v1/responses']);
    // The backup's address is `${second.url}/v1`: the path is the address's, then /responses.
    expect(second.journal.map((e) => e.path)).to.deep.equal(['/v1/responses']);
    expect(second.journal[0]!.json).to.deep.equal(body);
    expect(second.journal[0]!.headers.authorization).to.equal('Bearer sk-fallback-test');
    const { record } = await recordOf('overloaded');
    expect(record).to.include({ dialect: 'responses', backend_id: backup });
    expect(record.attempt_log.map((e: any) => [e.outcome, e.status, e.backend_id])).to.deep.equal([
      ['retried', 503, t.backends.chat],
      ['succeeded', 200, backup],
    ]);
  });

  it('no fallback after a 400: the refusal passes through and the fallback is never called', async () => {
    primary.enqueue({ kind: 'refuse', status: 400 });
    const res = await ask('overloaded');
    expect(res.status).to.equal(400);
    expect(second.journal).to.have.length(0);
    const { record } = await recordOf('overloaded');
    expect(record.backend_id).to.equal(t.backends.chat);
    expect(record.attempt_log).to.have.length(1);
  });

  it('a fallback of another dialect, or another credential source, is refused at rule creation with 422; an unknown one 404', async () => {
    const other = await admin('POST', '/routing-rules', { model: 'x-other', backend_id: t.backends.chat, fallback_backend_ids: [t.backends.messages] });
    expect(other.status).to.equal(422);
    expect(other.body.error.code).to.equal('unprocessable_entity');
    const unknown = await admin('POST', '/routing-rules', { model: 'x-unknown', backend_id: t.backends.chat, fallback_backend_ids: ['bk_nothing'] });
    expect(unknown.status).to.equal(404);
    const twice = await admin('POST', '/routing-rules', { model: 'x-twice', backend_id: t.backends.chat, fallback_backend_ids: [t.backends.chat] });
    expect(twice.status).to.equal(400);
    // A caller-credential backend (a process of the same deployment with passthrough on) may
    // not fall back to one with its own credential, nor the other way round.
    const passthrough = await startTestServer({ db: server.db, secrets: server.secrets, credentialPassthrough: true });
    try {
      const via = (method: string, path: string, body?: unknown) =>
        call(passthrough.url, method, `/${t.tenancy}/v1/namespaces/${t.namespace}${path}`, { token: t.adminToken, body });
      const caller = await via('POST', '/backends', { name: 'caller', kind: 'chat_compat', address: `${second.url}/v1`, credential_source: 'caller' });
      expect(caller.status, caller.text).to.equal(201);
      for (const [from, to] of [[caller.body.backend_id, backup], [backup, caller.body.backend_id]]) {
        const mixed = await via('POST', '/routing-rules', { model: 'x-mixed', backend_id: from, fallback_backend_ids: [to] });
        expect(mixed.status, mixed.text).to.equal(422);
        expect(mixed.body.error.message).to.include('credential');
      }
    } finally {
      await passthrough.close();
    }
    // A backend that cannot be deleted while a rule falls back to it.
    expect((await admin('DELETE', `/backends/${backup}`)).status).to.equal(409);
  });
});
