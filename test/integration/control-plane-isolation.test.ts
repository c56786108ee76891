// Tenancy isolation: nothing of one tenancy is visible through another's session, and
// nothing of one namespace through another namespace's path. Every administration route is
// tried.
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { call, ownerSession, everyAdminRoute, makeFixture, type Account, type Fixture, type RouteCase } from '../support/control-plane.ts';

describe('control plane: tenancy isolation', () => {
  let server: TestServer;
  let a: { token: string; account: Account };
  let b: { token: string; account: Account };
  let aShared: Fixture;
  let bShared: Fixture;
  let bOnly: Fixture;

  before(async () => {
    server = await startTestServer();
    a = await ownerSession(server, 'alpha');
    b = await ownerSession(server, 'bravo');
    // Both tenancies have a namespace called "shared"; only bravo has "bravo-only".
    aShared = await makeFixture(server.url, a.account, a.token, 'shared');
    bShared = await makeFixture(server.url, b.account, b.token, 'shared');
    bOnly = await makeFixture(server.url, b.account, b.token, 'bravo-only');
  });
  after(async () => {
    await server?.close();
  });

  const attempt = (token: string, route: RouteCase) => call(server.url, route.method, route.path, { token, body: route.body?.() });

  it("answers 401 on every route of another tenancy's path", async () => {
    for (const route of everyAdminRoute('bravo', bShared)) {
      const res = await attempt(a.token, route);
      expect(res.status, route.name).to.equal(401);
      expect(res.body.error.code, route.name).to.equal('unauthorised');
    }
    const password = await call(server.url, 'POST', '/bravo/v1/account/password', {
      token: a.token,
      body: { current_password: a.account.password, new_password: 'long enough to pass validation' },
    });
    expect(password.status).to.equal(401);
    expect((await call(server.url, 'DELETE', '/bravo/v1/sessions/current', { token: a.token })).status).to.equal(401);
    const signIn = await call(server.url, 'POST', '/bravo/v1/sessions', { body: { email: a.account.email, password: a.account.password } });
    expect(signIn.status).to.equal(401);
    // The session itself still works where it belongs.
    expect((await call(server.url, 'GET', '/alpha/v1/namespaces', { token: a.token })).status).to.equal(200);
  });

  it("answers 404 for another tenancy's namespace on one's own path", async () => {
    for (const route of everyAdminRoute('alpha', bOnly).filter((r) => r.path.includes('/namespaces/'))) {
      const res = await attempt(a.token, route);
      expect(res.status, route.name).to.equal(404);
      expect(res.body.error.code, route.name).to.equal('not_found');
    }
  });

  it("answers 404 for another tenancy's backends, rules, keys and users under a namespace of the same name", async () => {
    const targets = everyAdminRoute('alpha', { ...bShared, ns: 'shared' }).filter((r) =>
      [bShared.backend_id, bShared.rule_id, bShared.api_key_id, bShared.user_id].some((id) => r.path.endsWith(id)),
    );
    expect(targets.map((r) => r.name)).to.have.members([
      'GET backend',
      'PATCH backend',
      'DELETE backend',
      'GET routing-rule',
      'PATCH routing-rule',
      'DELETE routing-rule',
      'GET api-key',
      'DELETE api-key',
      'PATCH user',
      'DELETE user',
    ]);
    for (const route of targets) {
      const res = await attempt(a.token, route);
      expect(res.status, route.name).to.equal(404);
      expect(res.body.error.code, route.name).to.equal('not_found');
    }
  });

  it("answers 404 for another namespace's resources within one tenancy", async () => {
    const { token } = b;
    const crossed = everyAdminRoute('bravo', { ...bOnly, ns: 'shared' }).filter((r) =>
      [bOnly.backend_id, bOnly.rule_id, bOnly.api_key_id].some((id) => r.path.endsWith(id)),
    );
    expect(crossed).to.have.length(8);
    for (const route of crossed) {
      const res = await attempt(token, route);
      expect(res.status, route.name).to.equal(404);
    }
  });

  it("refuses a rule that names another tenancy's backend (404)", async () => {
    const res = await call(server.url, 'POST', '/alpha/v1/namespaces/shared/routing-rules', {
      token: a.token,
      body: { model: 'steal', backend_id: bShared.backend_id },
    });
    expect(res.status).to.equal(404);
    expect(res.body.error.code).to.equal('not_found');
  });

  it("lists only one's own resources", async () => {
    const lists = ['/alpha/v1/namespaces', '/alpha/v1/users', '/alpha/v1/namespaces/shared/backends', '/alpha/v1/namespaces/shared/routing-rules', '/alpha/v1/namespaces/shared/api-keys'];
    const foreign = [bShared, bOnly].flatMap((f) => [f.backend_id, f.rule_id, f.api_key_id, f.user_id]);
    for (const path of lists) {
      const res = await call(server.url, 'GET', path, { token: a.token });
      expect(res.status, path).to.equal(200);
      for (const id of foreign) expect(res.text, path).not.to.include(id);
    }
    const ns = await call(server.url, 'GET', '/alpha/v1/namespaces', { token: a.token });
    expect(ns.body.data.map((n: any) => n.name)).to.deep.equal(['shared']);
  });

  it("leaves the other tenancy's resources untouched by all those attempts", async () => {
    const base = '/bravo/v1/namespaces/shared';
    for (const path of [`${base}/backends/${bShared.backend_id}`, `${base}/routing-rules/${bShared.rule_id}`, `${base}/api-keys/${bShared.api_key_id}`]) {
      const res = await call(server.url, 'GET', path, { token: b.token });
      expect(res.status, path).to.equal(200);
    }
    const key = await call(server.url, 'GET', `${base}/api-keys/${bShared.api_key_id}`, { token: b.token });
    expect(key.body.revoked_at).to.equal(null);
    const rule = await call(server.url, 'GET', `${base}/routing-rules/${bShared.rule_id}`, { token: b.token });
    expect(rule.body.priority).to.equal(0);
    const users = await call(server.url, 'GET', '/bravo/v1/users', { token: b.token });
    expect(users.body.data.map((u: any) => u.user_id)).to.include(bShared.user_id);
    expect(aShared.backend_id).not.to.equal(bShared.backend_id);
  });
});
