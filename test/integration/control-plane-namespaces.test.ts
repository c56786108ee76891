import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { call, ownerSession } from '../support/control-plane.ts';

const HORIZON = 129_600; // the default metadata_horizon_minutes

describe('control plane: tenancy and namespaces', () => {
  let server: TestServer;
  let token: string;
  const post = (path: string, body: unknown) => call(server.url, 'POST', path, { token, body });
  const patch = (path: string, body: unknown) => call(server.url, 'PATCH', path, { token, body });
  const get = (path: string) => call(server.url, 'GET', path, { token });

  before(async () => {
    server = await startTestServer();
    token = (await ownerSession(server, 'acme')).token;
  });
  after(async () => {
    await server?.close();
  });

  it('creates a namespace and answers its fields, effective retention included', async () => {
    const res = await post('/acme/v1/namespaces', { name: 'prod' });
    expect(res.status).to.equal(201);
    expect(res.body).to.have.all.keys('namespace_id', 'name', 'retention_minutes', 'effective_retention_minutes', 'spend_limit', 'cache_ttl_minutes', 'created_at');
    expect(res.body.namespace_id).to.match(/^ns_[0-9A-HJKMNP-TV-Z]{26}$/);
    expect(res.body).to.include({ name: 'prod', retention_minutes: null, effective_retention_minutes: HORIZON, spend_limit: null });
    expect(Date.parse(res.body.created_at)).to.be.closeTo(Date.now(), 60_000);

    const one = await get('/acme/v1/namespaces/prod');
    expect(one.status).to.equal(200);
    expect(one.body).to.deep.equal(res.body);
    const list = await get('/acme/v1/namespaces');
    expect(list.body.data.map((n: any) => n.name)).to.include('prod');
  });

  it('refuses a duplicate name with 409 conflict', async () => {
    expect((await post('/acme/v1/namespaces', { name: 'dup' })).status).to.equal(201);
    const again = await post('/acme/v1/namespaces', { name: 'dup' });
    expect(again.status).to.equal(409);
    expect(again.body.error.code).to.equal('conflict');
  });

  it('refuses bad names, the reserved v1 included, with 400 naming the field', async () => {
    for (const name of ['v1', 'Upper', '-lead', '', 'a'.repeat(64), 'has space', 'under_score', 7]) {
      const res = await post('/acme/v1/namespaces', { name });
      expect(res.status, JSON.stringify(name)).to.equal(400);
      expect(res.body.error.code).to.equal('bad_request');
      expect(res.body.error.message).to.match(/^name: /);
    }
    const extra = await post('/acme/v1/namespaces', { name: 'fine', colour: 'blue' });
    expect(extra.status).to.equal(400);
    expect(extra.body.error.message).to.include('colour');
    const notObject = await post('/acme/v1/namespaces', ['fine']);
    expect(notObject.status).to.equal(400);
    const badJson = await call(server.url, 'POST', '/acme/v1/namespaces', { token, raw: '{"name":' });
    expect(badJson.status).to.equal(400);
    const tooLarge = await post('/acme/v1/namespaces', { name: 'big', pad: 'x'.repeat(70_000) });
    expect(tooLarge.status).to.equal(413);
    expect(tooLarge.body.error.code).to.equal('body_too_large');
  });

  it('patches retention and spend limit, answering the effective retention', async () => {
    await post('/acme/v1/namespaces', { name: 'retained' });
    const set = await patch('/acme/v1/namespaces/retained', { retention_minutes: 60, spend_limit: 5_000_000 });
    expect(set.status).to.equal(200);
    expect(set.body).to.include({ retention_minutes: 60, effective_retention_minutes: 60, spend_limit: 5_000_000 });

    const clamped = await patch('/acme/v1/namespaces/retained', { retention_minutes: HORIZON * 10 });
    expect(clamped.body).to.include({ retention_minutes: HORIZON * 10, effective_retention_minutes: HORIZON, spend_limit: 5_000_000 });

    const zero = await patch('/acme/v1/namespaces/retained', { retention_minutes: 0 });
    expect(zero.body).to.include({ retention_minutes: 0, effective_retention_minutes: HORIZON });

    const unset = await patch('/acme/v1/namespaces/retained', { retention_minutes: null, spend_limit: null });
    expect(unset.body).to.include({ retention_minutes: null, effective_retention_minutes: HORIZON, spend_limit: null });

    for (const body of [{ retention_minutes: -1 }, { retention_minutes: 1.5 }, { retention_minutes: '60' }, { spend_limit: -5 }, { name: 'renamed' }]) {
      const res = await patch('/acme/v1/namespaces/retained', body);
      expect(res.status, JSON.stringify(body)).to.equal(400);
      expect(res.body.error.message).to.include(Object.keys(body)[0]!);
    }
  });

  it("takes the tenancy's horizon when the namespace names none, and keeps everything on 0", async () => {
    await post('/acme/v1/namespaces', { name: 'inherits' });
    await post('/acme/v1/namespaces', { name: 'keeps', retention_minutes: 0 });
    await post('/acme/v1/namespaces', { name: 'own', retention_minutes: 10 });
    const t = await patch('/acme/v1/tenancy', { retention_minutes: 30 });
    expect(t.status).to.equal(200);
    expect(t.body).to.include({ retention_minutes: 30, effective_retention_minutes: 30 });
    expect((await get('/acme/v1/namespaces/inherits')).body.effective_retention_minutes).to.equal(30);
    expect((await get('/acme/v1/namespaces/keeps')).body.effective_retention_minutes).to.equal(HORIZON);
    expect((await get('/acme/v1/namespaces/own')).body.effective_retention_minutes).to.equal(10);
    await patch('/acme/v1/tenancy', { retention_minutes: null });
    expect((await get('/acme/v1/namespaces/inherits')).body.effective_retention_minutes).to.equal(HORIZON);
  });

  it('follows the deployment metadata horizon', async () => {
    await post('/acme/v1/namespaces', { name: 'horizon', retention_minutes: 5000 });
    await server.pool.query(`UPDATE sarsen.settings SET value = '1000'::jsonb WHERE name = 'metadata_horizon_minutes'`);
    try {
      await server.settings.refresh();
      expect((await get('/acme/v1/namespaces/horizon')).body.effective_retention_minutes).to.equal(1000);
    } finally {
      await server.pool.query(`UPDATE sarsen.settings SET value = '${HORIZON}'::jsonb WHERE name = 'metadata_horizon_minutes'`);
      await server.settings.refresh();
    }
  });

  it('answers 404 for a namespace that does not exist', async () => {
    for (const method of ['GET', 'PATCH', 'DELETE'] as const) {
      const res = await call(server.url, method, '/acme/v1/namespaces/nope', { token, body: method === 'PATCH' ? {} : undefined });
      expect(res.status, method).to.equal(404);
      expect(res.body.error.code).to.equal('not_found');
    }
  });

  it('deletes a namespace with its backends, rules and keys', async () => {
    await post('/acme/v1/namespaces', { name: 'doomed' });
    const bk = await post('/acme/v1/namespaces/doomed/backends', { name: 'b', kind: 'messages', address: 'https://93.184.216.34' });
    expect(bk.status).to.equal(201);
    expect((await post('/acme/v1/namespaces/doomed/routing-rules', { model: 'claude-*', backend_id: bk.body.backend_id })).status).to.equal(201);
    expect((await post('/acme/v1/namespaces/doomed/api-keys', { name: 'k', grants: ['use'] })).status).to.equal(201);
    const del = await call(server.url, 'DELETE', '/acme/v1/namespaces/doomed', { token });
    expect(del.status).to.equal(204);
    expect(del.text).to.equal('');
    expect((await get('/acme/v1/namespaces/doomed')).status).to.equal(404);
    const { rows } = await server.pool.query('SELECT count(*)::int AS n FROM sarsen.backends WHERE id = $1', [bk.body.backend_id]);
    expect(rows[0].n).to.equal(0);
    // The name is free again.
    expect((await post('/acme/v1/namespaces', { name: 'doomed' })).status).to.equal(201);
  });

  describe('tenancy', () => {
    it('answers the tenancy and patches its display name and horizon', async () => {
      const got = await get('/acme/v1/tenancy');
      expect(got.status).to.equal(200);
      expect(got.body).to.have.all.keys('tenancy_id', 'slug', 'display_name', 'retention_minutes', 'effective_retention_minutes', 'created_at');
      expect(got.body.tenancy_id).to.match(/^ten_/);
      expect(got.body.slug).to.equal('acme');
      const renamed = await patch('/acme/v1/tenancy', { display_name: 'Acme Corporation' });
      expect(renamed.status).to.equal(200);
      expect(renamed.body.display_name).to.equal('Acme Corporation');
      expect((await get('/acme/v1/tenancy')).body.display_name).to.equal('Acme Corporation');
    });

    it('refuses bad tenancy payloads with 400', async () => {
      for (const body of [{ display_name: '' }, { retention_minutes: -3 }, { slug: 'other' }, { display_name: 'a\nb' }]) {
        const res = await patch('/acme/v1/tenancy', body);
        expect(res.status, JSON.stringify(body)).to.equal(400);
        expect(res.body.error.message).to.include(Object.keys(body)[0]!);
      }
    });
  });
});
