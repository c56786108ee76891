// Caller-credential backends behind --credential-passthrough (issue 9).
import { expect } from 'chai';
import crypto from 'node:crypto';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { call } from '../support/control-plane.ts';
import { registerSecret } from '../support/log-guard.ts';
import { rawRequest, json, until } from '../support/http.ts';

describe('caller-credential backends', function () {
  this.timeout(60_000);
  let provider: FakeProvider;
  let server: TestServer;
  let t: Tenant;

  const credential = (label: string) => {
    const c = `sk-${label}-${crypto.randomBytes(12).toString('hex')}`;
    registerSecret(c);
    return c;
  };

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer({ credentialPassthrough: true, settings: { sweep_interval_ms: 100, heartbeat_ms: 200, retry_base_ms: 20, retry_max_ms: 50 } });
    t = await provision(server, provider);
    for (const [name, kind, address, model] of [
      ['byok-chat', 'chat_compat', `${provider.url}/v1`, 'byok-gpt-*'],
      ['byok-messages', 'messages', provider.url, 'byok-claude-*'],
    ] as const) {
      const b = await call(server.url, 'POST', `/${t.tenancy}/v1/namespaces/${t.namespace}/backends`, {
        token: t.adminToken,
        body: { name, kind, address, credential_source: 'caller' },
      });
      expect(b.status, b.text).to.equal(201);
      expect(b.body.has_credential).to.equal(false);
      const r = await call(server.url, 'POST', `/${t.tenancy}/v1/namespaces/${t.namespace}/routing-rules`, { token: t.adminToken, body: { model, backend_id: b.body.backend_id } });
      expect(r.status).to.equal(201);
    }
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });
  beforeEach(() => provider.reset());

  const send = (path: string, body: object, headers: Record<string, string>) =>
    rawRequest(`${t.base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key, ...headers }, body: JSON.stringify(body) });
  const chat = (content: string) => ({ model: 'byok-gpt-1', messages: [{ role: 'user', content }] });
  const sealedRows = async () => (await server.pool.query(`SELECT request_id, sealed FROM sarsen.request_credentials`)).rows as { request_id: string; sealed: Buffer }[];
  const requestCount = async () => (await server.pool.query(`SELECT count(*)::int AS n FROM sarsen.requests`)).rows[0].n as number;

  it('forwards the call\'s own credential in the header each dialect expects', async () => {
    const mine = credential('chat');
    const res = await send('/chat/completions', chat('byok'), { authorization: `Bearer ${mine}` });
    expect(res.status, res.body.toString()).to.equal(200);
    expect(provider.journal[0]!.headers.authorization).to.equal(`Bearer ${mine}`);
    expect(provider.journal[0]!.headers['x-api-key']).to.equal(undefined);

    const ant = credential('ant');
    const m = await send('/messages', { model: 'byok-claude-1', max_tokens: 10, messages: [{ role: 'user', content: 'byok' }] }, { 'x-api-key': ant });
    expect(m.status, m.body.toString()).to.equal(200);
    expect(provider.journal[1]!.headers['x-api-key']).to.equal(ant);
    expect(provider.journal[1]!.headers.authorization).to.equal(undefined);
    expect(await sealedRows()).to.deep.equal([]); // destroyed with the terminal write
  });

  it('holds the credential sealed while the request runs (ciphertext only), and destroys it on success', async () => {
    const mine = credential('held');
    provider.enqueue({ kind: 'default', delayMs: 500 });
    const pending = send('/chat/completions', chat('held'), { authorization: `Bearer ${mine}` });
    await provider.waitForRequests(1);
    const rows = await sealedRows();
    expect(rows).to.have.length(1);
    expect(rows[0]!.sealed.includes(Buffer.from(mine))).to.equal(false);
    expect(rows[0]!.sealed[0]).to.equal(1); // key version byte
    expect((await pending).status).to.equal(200);
    expect(await sealedRows()).to.deep.equal([]);
    // No route returns it: the record and the listing carry nothing of it.
    const rec = await rawRequest(`${t.base}/requests/${rows[0]!.request_id}`, { headers: { 'x-sarsen-key': t.key } });
    const listing = await rawRequest(`${t.base}/requests`, { headers: { 'x-sarsen-key': t.key } });
    for (const r of [rec, listing]) expect(r.body.toString()).to.not.include(mine);
  });

  it('keeps it across a retry and destroys it on a terminal failure', async () => {
    const mine = credential('failing');
    provider.enqueue({ kind: 'refuse', status: 503 }, { kind: 'refuse', status: 401, body: '{"error":"bad key"}' });
    const res = await send('/chat/completions', chat('failing'), { authorization: `Bearer ${mine}` });
    expect(res.status).to.equal(401);
    expect(provider.journal.map((e) => e.headers.authorization)).to.deep.equal([`Bearer ${mine}`, `Bearer ${mine}`]);
    expect(await sealedRows()).to.deep.equal([]);
  });

  it('keeps it across a recovery, then destroys it on success', async () => {
    const mine = credential('recovered');
    provider.enqueue({ kind: 'hang' });
    const pending = send('/chat/completions', chat('recovered'), { authorization: `Bearer ${mine}` });
    await provider.waitForRequests(1);
    const id = (await sealedRows())[0]!.request_id;
    // The lease lapses as a partitioned worker's would: its renewals do not land (the worker
    // still renews it here, so it is made to lapse again until the sweep took the request over).
    await until(async () => {
      const { rowCount } = await server.pool.query(
        `UPDATE sarsen.requests SET lease_expires_at = now() - interval '1 second' WHERE id = $1 AND status = 'running' AND recoveries = 0`,
        [id],
      );
      return rowCount === 0 ? true : undefined;
    }, 30_000, 50);
    const res = await pending;
    expect(res.status).to.equal(200);
    const rec = json(await rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key } }));
    expect(rec).to.include({ status: 'succeeded', attempts: 2, recoveries: 1 });
    expect(provider.journal.map((e) => e.headers.authorization)).to.deep.equal([`Bearer ${mine}`, `Bearer ${mine}`]);
    await until(async () => (provider.journal[0]!.clientAborted ? true : undefined)); // the zombie's call was stopped
    expect(await sealedRows()).to.deep.equal([]);
  });

  it('one body under two credentials runs twice; the same credential again attaches', async () => {
    const a = credential('a');
    const b = credential('b');
    const body = chat('same body');
    expect((await send('/chat/completions', body, { authorization: `Bearer ${a}` })).status).to.equal(200);
    expect((await send('/chat/completions', body, { authorization: `Bearer ${b}` })).status).to.equal(200);
    expect((await send('/chat/completions', body, { authorization: `Bearer ${a}` })).status).to.equal(200);
    expect(provider.journal.map((e) => e.headers.authorization)).to.deep.equal([`Bearer ${a}`, `Bearer ${b}`]);
  });

  it('refuses a call with no credential (401 caller_credential_missing) and POST /requests (422), writing no row', async () => {
    const before = await requestCount();
    const none = await send('/chat/completions', chat('no credential'), {});
    expect(none.status).to.equal(401);
    expect(json(none).error.code).to.equal('caller_credential_missing');
    // The Sarsen key in Authorization is not a provider credential.
    const keyOnly = await rawRequest(`${t.base}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${t.key}` },
      body: JSON.stringify(chat('key only')),
    });
    expect(keyOnly.status).to.equal(401);
    expect(json(keyOnly).error.code).to.equal('caller_credential_missing');
    const queued = await send('/requests', chat('queued'), { authorization: `Bearer ${credential('queued')}` });
    expect(queued.status).to.equal(422);
    expect(json(queued).error.code).to.equal('passthrough_disabled');
    expect(await requestCount()).to.equal(before);
    expect(provider.journal).to.have.length(0);
  });

  it('without the switch, submitting to a caller backend is 422 passthrough_disabled and writes no row', async () => {
    const off = await startTestServer({ db: server.db, secrets: server.secrets }); // the same deployment, switch off
    try {
      const before = await requestCount();
      const res = await rawRequest(`${off.url}/${t.tenancy}/${t.namespace}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key, authorization: `Bearer ${credential('off')}` },
        body: JSON.stringify(chat('switch off')),
      });
      expect(res.status).to.equal(422);
      expect(json(res).error.code).to.equal('passthrough_disabled');
      expect(await requestCount()).to.equal(before);
    } finally {
      await off.close();
    }
  });
});
