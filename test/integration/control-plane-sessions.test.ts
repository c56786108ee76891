import crypto from 'node:crypto';
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { registerSecret } from '../support/log-guard.ts';
import {
  call,
  createTenancy,
  addUser,
  signIn,
  signInAndChoose,
  everyAdminRoute,
  makeFixture,
  type Account,
  type Fixture,
} from '../support/control-plane.ts';

describe('control plane: console sessions and passwords', () => {
  let server: TestServer;
  let acme: Account;
  let acmeToken: string;
  let fixture: Fixture;

  before(async () => {
    server = await startTestServer();
    const chosen = await signInAndChoose(server.url, await createTenancy(server.pool, 'acme'));
    acme = chosen.account;
    acmeToken = chosen.token;
    fixture = await makeFixture(server.url, acme, acmeToken, 'main');
  });
  after(async () => {
    await server?.close();
  });

  describe('sign-in', () => {
    it('answers 201 with a ses_ token expiring in 12 hours, stored only as its SHA-256', async () => {
      const before = Date.now();
      const res = await call(server.url, 'POST', '/acme/v1/sessions', { body: { email: acme.email, password: acme.password } });
      const after = Date.now();
      expect(res.status).to.equal(201);
      registerSecret(res.body.token);
      expect(res.body.token).to.match(/^ses_[A-Za-z0-9_-]{43}$/);
      const expires = Date.parse(res.body.expires_at);
      expect(res.body.expires_at).to.match(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/);
      // Twelve hours from a moment during the call (a second's leeway for the clocks' rounding).
      expect(expires).to.be.within(before + 12 * 3600_000 - 1000, after + 12 * 3600_000 + 1000);
      expect(res.body.password_change_required).to.equal(false);

      const hash = crypto.createHash('sha256').update(res.body.token).digest();
      const { rows } = await server.pool.query(`SELECT token_hash FROM sarsen.sessions WHERE token_hash = $1`, [hash]);
      expect(rows).to.have.length(1);
      const dump = await server.pool.query(`SELECT t::text AS row FROM sarsen.sessions t`);
      for (const r of dump.rows) expect(r.row).not.to.include(res.body.token.slice(4));
    });

    it('matches the email case-insensitively', async () => {
      const res = await call(server.url, 'POST', '/acme/v1/sessions', { body: { email: acme.email.toUpperCase(), password: acme.password } });
      expect(res.status).to.equal(201);
      registerSecret(res.body.token);
    });

    it('answers every rejected sign-in with one identical 401 body', async () => {
      const other = await createTenancy(server.pool, 'globex');
      const disabled = await addUser(server.pool, acme, 'gone@acme.test', 'admin');
      await server.pool.query('UPDATE sarsen.users SET disabled = true WHERE id = $1', [disabled.user_id]);
      const attempts: [string, string, unknown][] = [
        ['unknown email', '/acme/v1/sessions', { email: 'nobody@acme.test', password: acme.password }],
        ['wrong password', '/acme/v1/sessions', { email: acme.email, password: 'not-the-password' }],
        ['disabled account, right password', '/acme/v1/sessions', { email: disabled.email, password: disabled.password }],
        ['unknown tenancy', '/nowhere/v1/sessions', { email: acme.email, password: acme.password }],
        ["another tenancy's account", '/acme/v1/sessions', { email: other.email, password: other.password }],
        ['not an email at all', '/acme/v1/sessions', { email: 'x', password: 'y' }],
      ];
      const answers = await Promise.all(attempts.map(([, path, body]) => call(server.url, 'POST', path, { body })));
      for (const [i, a] of answers.entries()) {
        expect(a.status, attempts[i]![0]).to.equal(401);
        expect(a.text, attempts[i]![0]).to.equal(answers[0]!.text);
        expect(a.headers.get('content-type')).to.match(/^application\/json/);
      }
      expect(answers[0]!.body.error.code).to.equal('unauthorised');
    });

    it('refuses a malformed sign-in payload with 400, and a non-JSON one with 415', async () => {
      const missing = await call(server.url, 'POST', '/acme/v1/sessions', { body: { email: acme.email } });
      expect(missing.status).to.equal(400);
      expect(missing.body.error.code).to.equal('bad_request');
      expect(missing.body.error.message).to.include('password');
      const extra = await call(server.url, 'POST', '/acme/v1/sessions', { body: { email: acme.email, password: 'x', remember: true } });
      expect(extra.status).to.equal(400);
      expect(extra.body.error.message).to.include('remember');
      const text = await call(server.url, 'POST', '/acme/v1/sessions', { raw: 'email=x', headers: { 'content-type': 'text/plain' } });
      expect(text.status).to.equal(415);
      expect(text.body.error.code).to.equal('unsupported_media_type');
    });
  });

  describe('session checks', () => {
    it('answers 401 identically for a missing, malformed, unknown, expired or signed-out session', async () => {
      const expiring = await signIn(server.url, acme);
      await server.pool.query(`UPDATE sarsen.sessions SET expires_at = now() - interval '1 second' WHERE token_hash = $1`, [
        crypto.createHash('sha256').update(expiring).digest(),
      ]);
      const signedOut = await signIn(server.url, acme);
      const out = await call(server.url, 'DELETE', '/acme/v1/sessions/current', { token: signedOut });
      expect(out.status).to.equal(204);

      const path = '/acme/v1/namespaces';
      const answers = await Promise.all([
        call(server.url, 'GET', path),
        call(server.url, 'GET', path, { headers: { authorization: 'Basic dXNlcjpwYXNz' } }),
        call(server.url, 'GET', path, { token: 'ses_' }),
        call(server.url, 'GET', path, { token: `ses_${crypto.randomBytes(32).toString('base64url')}` }),
        call(server.url, 'GET', path, { token: expiring }),
        call(server.url, 'GET', path, { token: signedOut }),
      ]);
      for (const a of answers) {
        expect(a.status).to.equal(401);
        expect(a.text).to.equal(answers[0]!.text);
      }
      expect(answers[0]!.body.error.code).to.equal('unauthorised');
      // The session in use elsewhere is untouched.
      expect((await call(server.url, 'GET', path, { token: acmeToken })).status).to.equal(200);
    });

    it("refuses another tenancy's session on this tenancy's path with 401", async () => {
      const other = await signInAndChoose(server.url, await createTenancy(server.pool, 'initech'));
      const res = await call(server.url, 'GET', '/acme/v1/namespaces', { token: other.token });
      expect(res.status).to.equal(401);
      expect(res.body.error.code).to.equal('unauthorised');
    });

    it('ends the sessions of an account that is disabled', async () => {
      const admin = await addUser(server.pool, acme, 'soon-disabled@acme.test', 'admin');
      const token = await signIn(server.url, admin);
      expect((await call(server.url, 'GET', '/acme/v1/namespaces', { token })).status).to.equal(200);
      const patch = await call(server.url, 'PATCH', `/acme/v1/users/${admin.user_id}`, { token: acmeToken, body: { disabled: true } });
      expect(patch.status).to.equal(200);
      expect((await call(server.url, 'GET', '/acme/v1/namespaces', { token })).status).to.equal(401);
    });
  });

  describe('unchosen passwords', () => {
    let fresh: Account;
    let token: string;
    before(async () => {
      fresh = await addUser(server.pool, acme, 'new-owner@acme.test', 'owner', false);
      const res = await call(server.url, 'POST', '/acme/v1/sessions', { body: { email: fresh.email, password: fresh.password } });
      expect(res.status).to.equal(201);
      expect(res.body.password_change_required).to.equal(true);
      token = res.body.token;
      registerSecret(token);
    });

    it('answers 403 password_change_required on every administration route', async () => {
      for (const route of everyAdminRoute('acme', fixture)) {
        const res = await call(server.url, route.method, route.path, { token, body: route.body?.() });
        expect(res.status, route.name).to.equal(403);
        expect(res.body.error.code, route.name).to.equal('password_change_required');
      }
    });

    it('refuses a wrong current password with 403 password_rejected', async () => {
      const res = await call(server.url, 'POST', '/acme/v1/account/password', {
        token,
        body: { current_password: 'wrong-wrong-wrong', new_password: 'a perfectly long password' },
      });
      expect(res.status).to.equal(403);
      expect(res.body.error.code).to.equal('password_rejected');
    });

    it('refuses a new password shorter than 12 characters, or equal to the current one, with 400', async () => {
      const short = await call(server.url, 'POST', '/acme/v1/account/password', {
        token,
        body: { current_password: fresh.password, new_password: 'short' },
      });
      expect(short.status).to.equal(400);
      expect(short.body.error.message).to.include('new_password');
      const same = await call(server.url, 'POST', '/acme/v1/account/password', {
        token,
        body: { current_password: fresh.password, new_password: fresh.password },
      });
      expect(same.status).to.equal(400);
      expect(same.body.error.message).to.include('new_password');
    });

    it('lets the account in once it chooses a password; the old one stops working, other sessions end', async () => {
      const second = await signIn(server.url, fresh);
      const chosen = 'correct horse battery staple';
      const res = await call(server.url, 'POST', '/acme/v1/account/password', {
        token,
        body: { current_password: fresh.password, new_password: chosen },
      });
      expect(res.status).to.equal(204);
      expect((await call(server.url, 'GET', '/acme/v1/users', { token })).status).to.equal(200);
      expect((await call(server.url, 'GET', '/acme/v1/users', { token: second })).status).to.equal(401);
      const old = await call(server.url, 'POST', '/acme/v1/sessions', { body: { email: fresh.email, password: fresh.password } });
      expect(old.status).to.equal(401);
      const renewed = await signIn(server.url, { ...fresh, password: chosen });
      expect((await call(server.url, 'GET', '/acme/v1/tenancy', { token: renewed })).status).to.equal(200);
      const { rows } = await server.pool.query('SELECT password_chosen, password_hash FROM sarsen.users WHERE id = $1', [fresh.user_id]);
      expect(rows[0].password_chosen).to.equal(true);
      expect(rows[0].password_hash).to.match(/^scrypt\$/);
      expect(rows[0].password_hash).not.to.include(chosen);
    });
  });

  describe('roles', () => {
    const sessions: Record<string, string> = {};
    before(async () => {
      for (const role of ['viewer', 'admin', 'owner'] as const) {
        const a = await addUser(server.pool, acme, `${role}-role@acme.test`, role);
        sessions[role] = await signIn(server.url, a);
      }
    });

    const RANK = { viewer: 1, admin: 2, owner: 3 } as const;

    for (const role of ['viewer', 'admin', 'owner'] as const) {
      it(`enforces the least role of every route for the ${role} role`, async () => {
        const target = await makeFixture(server.url, acme, acmeToken, `roles-${role}`);
        for (const route of everyAdminRoute('acme', target)) {
          const allowed = RANK[role] >= RANK[route.role];
          if (allowed && route.destructive) continue;
          const res = await call(server.url, route.method, route.path, { token: sessions[role], body: route.body?.() });
          if (allowed) {
            expect(res.status, `${role} ${route.name}: ${res.text}`).to.be.within(200, 299);
          } else {
            expect(res.status, `${role} ${route.name}`).to.equal(403);
            expect(res.body.error.code, `${role} ${route.name}`).to.equal('forbidden');
            expect(res.body.error.message).to.include(route.role);
          }
        }
      });
    }

    it('lets admins delete what they manage', async () => {
      const target = await makeFixture(server.url, acme, acmeToken, 'admin-deletes');
      const ns = `/acme/v1/namespaces/${target.ns}`;
      const token = sessions.admin;
      expect((await call(server.url, 'DELETE', `${ns}/api-keys/${target.api_key_id}`, { token })).status).to.equal(204);
      expect((await call(server.url, 'DELETE', `${ns}/routing-rules/${target.rule_id}`, { token })).status).to.equal(204);
      expect((await call(server.url, 'DELETE', `${ns}/backends/${target.backend_id}`, { token })).status).to.equal(204);
      expect((await call(server.url, 'DELETE', ns, { token })).status).to.equal(204);
      expect((await call(server.url, 'GET', ns, { token })).status).to.equal(404);
    });
  });

  it('signs out with 204, after which the token is refused', async () => {
    const token = await signIn(server.url, acme);
    expect((await call(server.url, 'DELETE', '/acme/v1/sessions/current', { token })).status).to.equal(204);
    expect((await call(server.url, 'DELETE', '/acme/v1/sessions/current', { token })).status).to.equal(401);
  });

  it('leaves unknown paths under a tenancy to the 404 handler', async () => {
    const res = await call(server.url, 'GET', '/acme/v1/nothing-here', { token: acmeToken });
    expect(res.status).to.equal(404);
    expect(res.body.error.code).to.equal('not_found');
    const noSession = await call(server.url, 'GET', '/acme/v1/nothing-here');
    expect(noSession.status).to.equal(404);
  });
});
