import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { registerSecret } from '../support/log-guard.ts';
import { call, ownerSession } from '../support/control-plane.ts';
import { hashApiKeySecret, parseApiKey } from '../../src/core/api-keys.ts';

describe('control plane: API keys', () => {
  let server: TestServer;
  let token: string;
  const base = '/acme/v1/namespaces/main/api-keys';
  const create = async (body: unknown) => {
    const res = await call(server.url, 'POST', base, { token, body });
    if (res.body?.key) registerSecret(res.body.key);
    return res;
  };

  before(async () => {
    server = await startTestServer();
    token = (await ownerSession(server, 'acme')).token;
    await call(server.url, 'POST', '/acme/v1/namespaces', { token, body: { name: 'main' } });
  });
  after(async () => {
    await server?.close();
  });

  it('answers the whole key once, at creation, and stores only an HMAC of its secret', async () => {
    const res = await create({ name: 'ci', grants: ['use'] });
    expect(res.status).to.equal(201);
    expect(res.body.key).to.match(/^sar_[A-Za-z0-9]{8}_[A-Za-z0-9]{43}$/);
    expect(res.body.api_key_id).to.match(/^key_/);
    const parsed = parseApiKey(res.body.key)!;
    expect(res.body).to.include({ prefix: parsed.prefix, name: 'ci', spend_limit: null, last_used_at: null, revoked_at: null });
    expect(res.body.grants).to.deep.equal(['use']);

    const { rows } = await server.pool.query('SELECT secret_hash, t::text AS row FROM sarsen.api_keys t WHERE id = $1', [res.body.api_key_id]);
    expect(rows[0].secret_hash.equals(hashApiKeySecret(server.secrets.apiKeyHashKey, parsed.prefix, parsed.secret))).to.equal(true);
    expect(rows[0].row).not.to.include(parsed.secret);

    for (const path of [base, `${base}/${res.body.api_key_id}`]) {
      const read = await call(server.url, 'GET', path, { token });
      expect(read.status).to.equal(200);
      expect(read.text).not.to.include(parsed.secret);
      expect(read.text).not.to.match(/"key"|secret_hash/);
    }
    const one = await call(server.url, 'GET', `${base}/${res.body.api_key_id}`, { token });
    expect(one.body).to.have.all.keys('api_key_id', 'prefix', 'name', 'grants', 'spend_limit', 'limits', 'created_at', 'last_used_at', 'revoked_at');
  });

  it('takes ["use"] or ["use","manage"] in either order, and a spend limit', async () => {
    const res = await create({ name: 'manager', grants: ['manage', 'use'], spend_limit: 2_500_000 });
    expect(res.status).to.equal(201);
    expect(res.body.grants).to.deep.equal(['use', 'manage']);
    expect(res.body.spend_limit).to.equal(2_500_000);
  });

  it('refuses malformed payloads with 400 naming the field', async () => {
    const cases: [unknown, string][] = [
      [{ name: 'x', grants: ['manage'] }, 'grants'],
      [{ name: 'x', grants: [] }, 'grants'],
      [{ name: 'x', grants: ['use', 'use'] }, 'grants'],
      [{ name: 'x', grants: ['admin'] }, 'grants'],
      [{ name: 'x', grants: 'use' }, 'grants'],
      [{ name: 'x' }, 'grants'],
      [{ grants: ['use'] }, 'name'],
      [{ name: 'x', grants: ['use'], spend_limit: -1 }, 'spend_limit'],
      [{ name: 'x', grants: ['use'], prefix: 'AAAAAAAA' }, 'prefix'],
    ];
    for (const [body, field] of cases) {
      const res = await create(body);
      expect(res.status, JSON.stringify(body)).to.equal(400);
      expect(res.body.error.message, JSON.stringify(body)).to.include(field);
    }
  });

  it('refuses a second live key of the same name (409), and frees the name on revocation', async () => {
    const first = await create({ name: 'rotating', grants: ['use'] });
    const dup = await create({ name: 'rotating', grants: ['use'] });
    expect(dup.status).to.equal(409);
    expect(dup.body.error.code).to.equal('conflict');
    expect((await call(server.url, 'DELETE', `${base}/${first.body.api_key_id}`, { token })).status).to.equal(204);
    expect((await create({ name: 'rotating', grants: ['use'] })).status).to.equal(201);
  });

  it('revokes with DELETE, keeping the row; revoking again changes nothing', async () => {
    const k = await create({ name: 'revoked', grants: ['use'] });
    const del = await call(server.url, 'DELETE', `${base}/${k.body.api_key_id}`, { token });
    expect(del.status).to.equal(204);
    const after = await call(server.url, 'GET', `${base}/${k.body.api_key_id}`, { token });
    expect(after.status).to.equal(200);
    expect(Date.parse(after.body.revoked_at)).to.be.closeTo(Date.now(), 60_000);
    expect((await call(server.url, 'DELETE', `${base}/${k.body.api_key_id}`, { token })).status).to.equal(204);
    expect((await call(server.url, 'GET', `${base}/${k.body.api_key_id}`, { token })).body.revoked_at).to.equal(after.body.revoked_at);
    const list = await call(server.url, 'GET', base, { token });
    expect(list.body.data.find((r: any) => r.api_key_id === k.body.api_key_id).revoked_at).to.equal(after.body.revoked_at);
  });

  it('answers 404 for a key that does not exist', async () => {
    for (const method of ['GET', 'DELETE'] as const) {
      const res = await call(server.url, method, `${base}/key_01ARZ3NDEKTSV4RRFFQ69G5FAV`, { token });
      expect(res.status).to.equal(404);
      expect(res.body.error.code).to.equal('not_found');
    }
  });
});
