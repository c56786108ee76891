import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { registerSecret } from '../support/log-guard.ts';
import { call, ownerSession, signIn, type Account } from '../support/control-plane.ts';

describe('control plane: users', () => {
  let server: TestServer;
  let owner: { token: string; account: Account };
  const users = '/acme/v1/users';
  const create = async (body: unknown) => {
    const res = await call(server.url, 'POST', users, { token: owner.token, body });
    if (typeof res.body?.password === 'string') registerSecret(res.body.password);
    return res;
  };

  before(async () => {
    server = await startTestServer();
    owner = await ownerSession(server, 'acme');
  });
  after(async () => {
    await server?.close();
  });

  it('creates a user with a generated, unchosen password answered once', async () => {
    const res = await create({ email: 'Dana@Example.TEST', role: 'admin' });
    expect(res.status).to.equal(201);
    expect(res.body).to.include({ email: 'dana@example.test', role: 'admin', disabled: false, password_chosen: false });
    expect(res.body.user_id).to.match(/^usr_/);
    expect(res.body.password).to.be.a('string').with.length(24);

    const listed = await call(server.url, 'GET', users, { token: owner.token });
    expect(listed.status).to.equal(200);
    expect(listed.text).not.to.include(res.body.password);
    expect(listed.text).not.to.match(/password_hash|scrypt/);
    const row = listed.body.data.find((u: any) => u.user_id === res.body.user_id);
    expect(row).to.have.all.keys('user_id', 'email', 'role', 'disabled', 'password_chosen', 'created_at');

    const token = await signIn(server.url, { tenancy: 'acme', email: 'dana@example.test', password: res.body.password });
    const blocked = await call(server.url, 'GET', '/acme/v1/namespaces', { token });
    expect(blocked.status).to.equal(403);
    expect(blocked.body.error.code).to.equal('password_change_required');
  });

  it('refuses a duplicate email (any case) with 409, and bad payloads with 400', async () => {
    expect((await create({ email: 'erin@example.test', role: 'viewer' })).status).to.equal(201);
    const dup = await create({ email: 'ERIN@example.test', role: 'admin' });
    expect(dup.status).to.equal(409);
    expect(dup.body.error.code).to.equal('conflict');
    const cases: [unknown, string][] = [
      [{ email: 'not-an-email', role: 'viewer' }, 'email'],
      [{ email: 'x@y', role: 'superuser' }, 'role'],
      [{ role: 'viewer' }, 'email'],
      [{ email: 'x@y', role: 'viewer', password: 'mine' }, 'password'],
    ];
    for (const [body, field] of cases) {
      const res = await create(body);
      expect(res.status, JSON.stringify(body)).to.equal(400);
      expect(res.body.error.message).to.include(field);
    }
  });

  it('changes a role, and disabling ends sessions and refuses sign-in until re-enabled', async () => {
    const created = await create({ email: 'frank@example.test', role: 'viewer' });
    const id = created.body.user_id;
    const promoted = await call(server.url, 'PATCH', `${users}/${id}`, { token: owner.token, body: { role: 'admin' } });
    expect(promoted.status).to.equal(200);
    expect(promoted.body.role).to.equal('admin');

    const frank = { tenancy: 'acme', email: 'frank@example.test', password: created.body.password };
    const token = await signIn(server.url, frank);
    const disabled = await call(server.url, 'PATCH', `${users}/${id}`, { token: owner.token, body: { disabled: true } });
    expect(disabled.body.disabled).to.equal(true);
    expect((await call(server.url, 'POST', '/acme/v1/account/password', { token, body: { current_password: frank.password, new_password: 'whatever-long-enough' } })).status).to.equal(401);
    expect((await call(server.url, 'POST', '/acme/v1/sessions', { body: { email: frank.email, password: frank.password } })).status).to.equal(401);

    await call(server.url, 'PATCH', `${users}/${id}`, { token: owner.token, body: { disabled: false } });
    await signIn(server.url, frank);

    for (const body of [{ role: 'root' }, { disabled: 'yes' }, { email: 'new@example.test' }]) {
      const res = await call(server.url, 'PATCH', `${users}/${id}`, { token: owner.token, body });
      expect(res.status, JSON.stringify(body)).to.equal(400);
    }
  });

  it('keeps at least one enabled owner (409)', async () => {
    const self = owner.account.user_id;
    for (const body of [{ role: 'admin' }, { disabled: true }]) {
      const res = await call(server.url, 'PATCH', `${users}/${self}`, { token: owner.token, body });
      expect(res.status, JSON.stringify(body)).to.equal(409);
      expect(res.body.error.code).to.equal('conflict');
    }
    const del = await call(server.url, 'DELETE', `${users}/${self}`, { token: owner.token });
    expect(del.status).to.equal(409);

    const second = await create({ email: 'grace@example.test', role: 'owner' });
    const demoted = await call(server.url, 'PATCH', `${users}/${second.body.user_id}`, { token: owner.token, body: { role: 'viewer' } });
    expect(demoted.status).to.equal(200);
    await call(server.url, 'PATCH', `${users}/${second.body.user_id}`, { token: owner.token, body: { role: 'owner' } });
    // With a second enabled owner, the first may step down.
    const stepDown = await call(server.url, 'PATCH', `${users}/${self}`, { token: owner.token, body: { role: 'admin' } });
    expect(stepDown.status).to.equal(200);
    expect((await call(server.url, 'GET', users, { token: owner.token })).status).to.equal(403);
  });

  it('deletes a user (204), after which it is gone', async () => {
    const other = await ownerSession(server, 'deletes');
    const created = await call(server.url, 'POST', '/deletes/v1/users', { token: other.token, body: { email: 'hank@example.test', role: 'viewer' } });
    registerSecret(created.body.password);
    const token = await signIn(server.url, { tenancy: 'deletes', email: 'hank@example.test', password: created.body.password });
    const del = await call(server.url, 'DELETE', `/deletes/v1/users/${created.body.user_id}`, { token: other.token });
    expect(del.status).to.equal(204);
    expect((await call(server.url, 'DELETE', `/deletes/v1/users/${created.body.user_id}`, { token: other.token })).status).to.equal(404);
    expect((await call(server.url, 'PATCH', `/deletes/v1/users/${created.body.user_id}`, { token: other.token, body: { role: 'admin' } })).status).to.equal(404);
    expect((await call(server.url, 'DELETE', '/deletes/v1/sessions/current', { token })).status).to.equal(401);
    const list = await call(server.url, 'GET', '/deletes/v1/users', { token: other.token });
    expect(list.body.data.map((u: any) => u.email)).to.deep.equal([other.account.email]);
  });
});
