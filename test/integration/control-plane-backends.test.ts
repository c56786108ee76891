import crypto from 'node:crypto';
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { registerSecret } from '../support/log-guard.ts';
import { call, ownerSession } from '../support/control-plane.ts';
import { loadBackendForCall } from '../../src/db/backends.ts';
import { openBackendCredential } from '../../src/control/backends.ts';
import { createKeyring, seal, sealedKeyVersion } from '../../src/core/sealing.ts';

function newCredential(): string {
  const c = `sk-test-${crypto.randomBytes(24).toString('hex')}`;
  registerSecret(c);
  return c;
}

async function sealedOf(server: TestServer, backendId: string): Promise<Buffer | null> {
  const { rows } = await server.pool.query('SELECT credential_sealed FROM sarsen.backends WHERE id = $1', [backendId]);
  return rows[0].credential_sealed;
}

describe('control plane: backends', () => {
  let server: TestServer;
  let token: string;
  const base = '/acme/v1/namespaces/main/backends';
  const post = (body: unknown) => call(server.url, 'POST', base, { token, body });
  const patch = (id: string, body: unknown) => call(server.url, 'PATCH', `${base}/${id}`, { token, body });

  before(async () => {
    server = await startTestServer();
    token = (await ownerSession(server, 'acme')).token;
    expect((await call(server.url, 'POST', '/acme/v1/namespaces', { token, body: { name: 'main' } })).status).to.equal(201);
  });
  after(async () => {
    await server?.close();
  });

  it('creates a backend of each kind with the dialect the kind fixes, normalising the address', async () => {
    const cases = [
      ['chat_compat', 'chat', 'https://api.example.com/v1/', 'https://api.example.com/v1'],
      ['aggregator', 'chat', 'https://router.example.com/api/v1//', 'https://router.example.com/api/v1'],
      ['messages', 'messages', 'https://api.example.com', 'https://api.example.com'],
      ['messages', 'messages', 'HTTP://LOCAL.EXAMPLE:8080/', 'http://local.example:8080'],
    ] as const;
    for (const [i, [kind, dialect, address, stored]] of cases.entries()) {
      const res = await post({ name: `kind-${i}`, kind, address });
      expect(res.status, res.text).to.equal(201);
      expect(res.body).to.have.all.keys('backend_id', 'name', 'kind', 'dialect', 'address', 'credential_source', 'has_credential', 'created_at');
      expect(res.body.backend_id).to.match(/^bk_/);
      expect(res.body).to.include({ kind, dialect, address: stored, credential_source: 'stored', has_credential: false });
    }
  });

  it('seals the credential: never answered, not in the column, version byte first, bound to the backend', async () => {
    const credential = newCredential();
    const res = await post({ name: 'sealed', kind: 'messages', address: 'https://api.example.com', credential });
    expect(res.status).to.equal(201);
    expect(res.body.has_credential).to.equal(true);
    expect(res.text).not.to.include(credential);
    const id = res.body.backend_id;

    const sealed = (await sealedOf(server, id))!;
    expect(sealed.includes(Buffer.from(credential, 'utf8'))).to.equal(false);
    expect(sealed.includes(Buffer.from(credential.slice(8, 24), 'utf8'))).to.equal(false);
    expect(sealedKeyVersion(sealed)).to.equal(1);
    expect(sealed[0]).to.equal(1);
    expect(sealed.length).to.equal(1 + 12 + Buffer.byteLength(credential) + 16);

    for (const path of [base, `${base}/${id}`]) {
      const read = await call(server.url, 'GET', path, { token });
      expect(read.status).to.equal(200);
      expect(read.text).not.to.include(credential);
      expect(read.text).not.to.include('credential_sealed');
    }

    const row = (await loadBackendForCall(server.pool, id))!;
    expect(row).to.include({ backend_id: id, kind: 'messages', dialect: 'messages', address: 'https://api.example.com', credential_source: 'stored' });
    const keyring = createKeyring([{ version: 1, secret: server.secrets.credentialKey }]);
    expect(openBackendCredential(keyring, row)).to.equal(credential);
    // Bound to its row: the same bytes under another backend id do not open.
    expect(() => openBackendCredential(keyring, { ...row, backend_id: 'bk_other' })).to.throw(/failed authentication/);
    // Another deployment's key does not open it either.
    expect(() => openBackendCredential(createKeyring([{ version: 1, secret: crypto.randomBytes(32) }]), row)).to.throw();
  });

  it('keeps opening old credentials after the credential key is rotated', async () => {
    const credential = newCredential();
    const res = await post({ name: 'rotated', kind: 'chat_compat', address: 'https://api.example.com/v1', credential });
    const row = (await loadBackendForCall(server.pool, res.body.backend_id))!;
    const next = crypto.randomBytes(32);
    const rotated = createKeyring([
      { version: 1, secret: server.secrets.credentialKey },
      { version: 2, secret: next },
    ]);
    expect(rotated.currentVersion).to.equal(2);
    expect(openBackendCredential(rotated, row)).to.equal(credential);
    const resealed = seal(rotated, credential, row.backend_id);
    expect(sealedKeyVersion(resealed)).to.equal(2);
    expect(openBackendCredential(rotated, { ...row, credential_sealed: resealed })).to.equal(credential);
    expect(() => openBackendCredential(createKeyring([{ version: 1, secret: server.secrets.credentialKey }]), { ...row, credential_sealed: resealed })).to.throw(
      /unknown key version 2/,
    );
  });

  it('refuses malformed addresses and payloads with 400 naming the field', async () => {
    const addresses = [
      'not a url',
      '/v1/relative',
      'ftp://files.example.com',
      'https://user:secret@api.example.com',
      'https://api.example.com/v1?key=1',
      'https://api.example.com/v1?',
      'https://api.example.com/v1#frag',
      'file:///etc/passwd',
    ];
    for (const address of addresses) {
      const res = await post({ name: 'bad-address', kind: 'chat_compat', address });
      expect(res.status, address).to.equal(400);
      expect(res.body.error.code).to.equal('bad_request');
      expect(res.body.error.message, address).to.match(/^address: /);
    }
    const bodies: [unknown, string][] = [
      [{ name: 'x', kind: 'openai', address: 'https://a.example' }, 'kind'],
      [{ name: '', kind: 'chat_compat', address: 'https://a.example' }, 'name'],
      [{ kind: 'chat_compat', address: 'https://a.example' }, 'name'],
      [{ name: 'x', kind: 'chat_compat', address: 'https://a.example', credential: 'line\nbreak' }, 'credential'],
      [{ name: 'x', kind: 'chat_compat', address: 'https://a.example', credential: '' }, 'credential'],
      [{ name: 'x', kind: 'chat_compat', address: 'https://a.example', credential_source: 'env' }, 'credential_source'],
      [{ name: 'x', kind: 'chat_compat', address: 'https://a.example', dialect: 'chat' }, 'dialect'],
      [{ name: 'x', kind: 'chat_compat', address: 'https://a.example', credential_source: 'caller', credential: 'sk-x' }, 'credential'],
    ];
    for (const [body, field] of bodies) {
      const res = await post(body);
      expect(res.status, JSON.stringify(body)).to.equal(400);
      expect(res.body.error.message, JSON.stringify(body)).to.include(field);
    }
  });

  it('refuses a duplicate name with 409', async () => {
    expect((await post({ name: 'twin', kind: 'chat_compat', address: 'https://a.example' })).status).to.equal(201);
    const dup = await post({ name: 'twin', kind: 'messages', address: 'https://b.example' });
    expect(dup.status).to.equal(409);
    expect(dup.body.error.code).to.equal('conflict');
  });

  it('patches name, kind, address and credential', async () => {
    const first = newCredential();
    const created = await post({ name: 'patchable', kind: 'chat_compat', address: 'https://a.example/v1', credential: first });
    const id = created.body.backend_id;
    const before = (await sealedOf(server, id))!;

    const renamed = await patch(id, { name: 'patched', kind: 'messages', address: 'https://b.example/' });
    expect(renamed.status).to.equal(200);
    expect(renamed.body).to.include({ name: 'patched', kind: 'messages', dialect: 'messages', address: 'https://b.example', has_credential: true });
    expect((await sealedOf(server, id))!.equals(before)).to.equal(true);

    const second = newCredential();
    const replaced = await patch(id, { credential: second });
    expect(replaced.status).to.equal(200);
    expect(replaced.text).not.to.include(second);
    const keyring = createKeyring([{ version: 1, secret: server.secrets.credentialKey }]);
    expect(openBackendCredential(keyring, (await loadBackendForCall(server.pool, id))!)).to.equal(second);

    const removed = await patch(id, { credential: null });
    expect(removed.body.has_credential).to.equal(false);
    expect(await sealedOf(server, id)).to.equal(null);

    expect((await patch(id, { address: 'ftp://nope' })).status).to.equal(400);
    expect((await patch(id, { colour: 'red' })).status).to.equal(400);
    await post({ name: 'taken', kind: 'chat_compat', address: 'https://a.example' });
    expect((await patch(id, { name: 'taken' })).status).to.equal(409);
    expect((await patch('bk_01ARZ3NDEKTSV4RRFFQ69G5FAV', { name: 'x' })).status).to.equal(404);
  });

  it('refuses to delete a backend that routing rules use (409), then deletes it (204)', async () => {
    const bk = await post({ name: 'in-use', kind: 'chat_compat', address: 'https://a.example' });
    const id = bk.body.backend_id;
    const rule = await call(server.url, 'POST', '/acme/v1/namespaces/main/routing-rules', { token, body: { model: 'in-use-*', backend_id: id } });
    expect(rule.status).to.equal(201);
    const refused = await call(server.url, 'DELETE', `${base}/${id}`, { token });
    expect(refused.status).to.equal(409);
    expect(refused.body.error.code).to.equal('conflict');
    expect(refused.body.error.message).to.include('routing rule');
    expect((await call(server.url, 'DELETE', `/acme/v1/namespaces/main/routing-rules/${rule.body.rule_id}`, { token })).status).to.equal(204);
    expect((await call(server.url, 'DELETE', `${base}/${id}`, { token })).status).to.equal(204);
    expect((await call(server.url, 'GET', `${base}/${id}`, { token })).status).to.equal(404);
    expect((await call(server.url, 'DELETE', `${base}/${id}`, { token })).status).to.equal(404);
  });

  it('refuses a kind change that breaks a rule\'s fallback chain with 422 naming the rule; a rule without fallbacks follows its backend', async () => {
    const rules = '/acme/v1/namespaces/main/routing-rules';
    const made = await Promise.all(['chain-a', 'chain-b', 'chain-c'].map((name) => post({ name, kind: 'chat_compat', address: 'https://a.example' })));
    const [a, b, c] = made.map((r) => r.body.backend_id as string);
    const rule = await call(server.url, 'POST', rules, { token, body: { model: 'chain-*', backend_id: a, fallback_backend_ids: [b] } });
    expect(rule.status, rule.text).to.equal(201);
    for (const id of [a, b]) {
      const res = await patch(id, { kind: 'messages' });
      expect(res.status, res.text).to.equal(422);
      expect(res.body.error.code).to.equal('unprocessable_entity');
      expect(res.body.error.message).to.include('"chain-*"').and.include(rule.body.rule_id).and.include('speaks');
      expect((await call(server.url, 'GET', `${base}/${id}`, { token })).body.kind).to.equal('chat_compat');
    }
    // Same dialect (aggregator speaks chat): allowed. A backend no chain depends on: allowed.
    expect((await patch(b, { kind: 'aggregator' })).status).to.equal(200);
    const alone = await call(server.url, 'POST', rules, { token, body: { model: 'alone-*', backend_id: c } });
    expect(alone.status).to.equal(201);
    expect((await patch(c, { kind: 'messages' })).status).to.equal(200);

    // Deleting a fallback is refused as deleting a rule's backend is, naming the rule.
    const refused = await call(server.url, 'DELETE', `${base}/${b}`, { token });
    expect(refused.status).to.equal(409);
    expect(refused.body.error.message).to.include('"chain-*"').and.include(rule.body.rule_id).and.include('a fallback');
    // Once the chain lets go of it, both go.
    expect((await call(server.url, 'PATCH', `${rules}/${rule.body.rule_id}`, { token, body: { fallback_backend_ids: [] } })).status).to.equal(200);
    expect((await call(server.url, 'DELETE', `${base}/${b}`, { token })).status).to.equal(204);
    expect((await patch(a, { kind: 'messages' })).status).to.equal(200);
  });

  describe('caller credentials without --credential-passthrough', () => {
    it('refuses to create a caller backend with 422 passthrough_disabled', async () => {
      const res = await post({ name: 'caller', kind: 'messages', address: 'https://api.example.com', credential_source: 'caller' });
      expect(res.status).to.equal(422);
      expect(res.body.error.code).to.equal('passthrough_disabled');
      expect(res.body.error.message).to.include('--credential-passthrough');
    });

    it('refuses to turn a backend into a caller backend with 422', async () => {
      const bk = await post({ name: 'stays-stored', kind: 'messages', address: 'https://api.example.com' });
      const res = await patch(bk.body.backend_id, { credential_source: 'caller' });
      expect(res.status).to.equal(422);
      expect(res.body.error.code).to.equal('passthrough_disabled');
      expect((await call(server.url, 'GET', `${base}/${bk.body.backend_id}`, { token })).body.credential_source).to.equal('stored');
    });
  });
});

describe('control plane: backends with --credential-passthrough', () => {
  let server: TestServer;
  let token: string;
  const base = '/acme/v1/namespaces/main/backends';

  before(async () => {
    server = await startTestServer({ credentialPassthrough: true });
    token = (await ownerSession(server, 'acme')).token;
    await call(server.url, 'POST', '/acme/v1/namespaces', { token, body: { name: 'main' } });
  });
  after(async () => {
    await server?.close();
  });

  it('creates a caller backend that holds no credential', async () => {
    const res = await call(server.url, 'POST', base, {
      token,
      body: { name: 'caller', kind: 'messages', address: 'https://api.example.com', credential_source: 'caller' },
    });
    expect(res.status).to.equal(201);
    expect(res.body).to.include({ credential_source: 'caller', has_credential: false });
    const row = (await loadBackendForCall(server.pool, res.body.backend_id))!;
    expect(row.credential_sealed).to.equal(null);
    expect(openBackendCredential(createKeyring([{ version: 1, secret: server.secrets.credentialKey }]), row)).to.equal(null);
  });

  it('refuses a credential source change that breaks a rule\'s fallback chain with 422 naming the rule', async () => {
    const made = await Promise.all(['src-a', 'src-b'].map((name) => call(server.url, 'POST', base, { token, body: { name, kind: 'chat_compat', address: 'https://a.example', credential: newCredential() } })));
    const [a, b] = made.map((r) => r.body.backend_id as string);
    const rule = await call(server.url, 'POST', '/acme/v1/namespaces/main/routing-rules', { token, body: { model: 'src-*', backend_id: a, fallback_backend_ids: [b] } });
    expect(rule.status, rule.text).to.equal(201);
    const res = await call(server.url, 'PATCH', `${base}/${b}`, { token, body: { credential_source: 'caller' } });
    expect(res.status, res.text).to.equal(422);
    expect(res.body.error.message).to.include('"src-*"').and.include('credential');
    expect((await loadBackendForCall(server.pool, b))!.credential_source).to.equal('stored');
  });

  it('still refuses a credential sent with credential_source caller (400)', async () => {
    const credential = newCredential();
    const res = await call(server.url, 'POST', base, {
      token,
      body: { name: 'both', kind: 'messages', address: 'https://api.example.com', credential_source: 'caller', credential },
    });
    expect(res.status).to.equal(400);
    expect(res.text).not.to.include(credential);
  });

  it('turns a stored backend into a caller backend, dropping its credential', async () => {
    const credential = newCredential();
    const bk = await call(server.url, 'POST', base, { token, body: { name: 'was-stored', kind: 'chat_compat', address: 'https://a.example', credential } });
    expect(bk.body.has_credential).to.equal(true);
    const res = await call(server.url, 'PATCH', `${base}/${bk.body.backend_id}`, { token, body: { credential_source: 'caller' } });
    expect(res.status).to.equal(200);
    expect(res.body).to.include({ credential_source: 'caller', has_credential: false });
    expect(await sealedOf(server, bk.body.backend_id)).to.equal(null);
    const withKey = await call(server.url, 'PATCH', `${base}/${bk.body.backend_id}`, { token, body: { credential: newCredential() } });
    expect(withKey.status).to.equal(400);
  });
});

describe('control plane: backend address policy (backends_public_only on)', () => {
  let server: TestServer;
  let token: string;
  const base = '/acme/v1/namespaces/main/backends';
  let n = 0;
  const create = (address: string) =>
    call(server.url, 'POST', base, { token, body: { name: `policy-${++n}`, kind: 'chat_compat', address } });

  before(async () => {
    server = await startTestServer({ settings: { backends_public_only: true } });
    token = (await ownerSession(server, 'acme')).token;
    await call(server.url, 'POST', '/acme/v1/namespaces', { token, body: { name: 'main' } });
  });
  after(async () => {
    await server?.close();
  });

  const refused: [string, RegExp][] = [
    ['http://127.0.0.1:8080', /is a loopback address/],
    ['http://127.1', /is a loopback address/],
    ['http://0x7f000001', /is a loopback address/],
    ['http://[::1]:9000', /is a loopback address/],
    ['http://10.1.2.3', /is a private address/],
    ['http://172.16.0.9', /is a private address/],
    ['http://192.168.1.10', /is a private address/],
    ['http://[fd12:3456::1]', /is a private \(unique local\) address/],
    ['http://169.254.169.254/latest', /is a link-local address/],
    ['http://[fe80::1]', /is a link-local address/],
    ['http://100.64.0.1', /is a shared \(CGNAT\) address/],
    ['http://224.0.0.1', /is a multicast address/],
    ['http://[ff02::1]', /is a multicast address/],
    ['http://0.0.0.0', /is an unspecified address/],
    ['http://[::]', /is an unspecified address/],
    ['http://[::ffff:127.0.0.1]', /is a loopback address/],
    ['http://[::ffff:10.0.0.1]', /is a private address/],
    ['http://localhost:8080', /resolves to a loopback address/],
    ['http://api.localhost', /resolves to a loopback address/],
  ];
  for (const [address, message] of refused) {
    it(`refuses ${address} with 422 backend_host_refused`, async () => {
      const res = await create(address);
      expect(res.status).to.equal(422);
      expect(res.body.error.code).to.equal('backend_host_refused');
      expect(res.body.error.message).to.match(message);
      expect(res.body.error.message).to.include('public addresses');
    });
  }

  it('names a resolved name by its class only, not by the addresses it resolved to', async () => {
    const res = await create('http://localhost');
    expect(res.body.error.message).not.to.match(/127\.0\.0\.1|::1/);
  });

  it('accepts a public address, and refuses changing it to a private one', async () => {
    const ok = await create('https://93.184.216.34/v1');
    expect(ok.status).to.equal(201);
    const moved = await call(server.url, 'PATCH', `${base}/${ok.body.backend_id}`, { token, body: { address: 'http://10.0.0.1/v1' } });
    expect(moved.status).to.equal(422);
    expect(moved.body.error.code).to.equal('backend_host_refused');
    const renamed = await call(server.url, 'PATCH', `${base}/${ok.body.backend_id}`, { token, body: { name: 'renamed' } });
    expect(renamed.status).to.equal(200);
    expect(renamed.body.address).to.equal('https://93.184.216.34/v1');
  });

  it('allows local addresses once the setting is off', async () => {
    await server.pool.query(`UPDATE sarsen.settings SET value = 'false'::jsonb WHERE name = 'backends_public_only'`);
    try {
      await server.settings.refresh();
      expect((await create('http://127.0.0.1:9')).status).to.equal(201);
      expect((await create('http://localhost:9')).status).to.equal(201);
    } finally {
      await server.pool.query(`UPDATE sarsen.settings SET value = 'true'::jsonb WHERE name = 'backends_public_only'`);
      await server.settings.refresh();
    }
    expect((await create('http://127.0.0.1:9')).status).to.equal(422);
  });
});
