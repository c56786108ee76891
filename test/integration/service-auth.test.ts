// serviceAuth on a test-local express app (the real service routes arrive with issue 4),
// on a real socket, against the real database, with keys made through the admin routes.
import http from 'node:http';
import crypto from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import express from 'express';
import { expect } from 'chai';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startTestServer, type TestServer } from '../support/server.ts';
import { registerSecret } from '../support/log-guard.ts';
import { track } from '../support/resources.ts';
import { call, createTenancy, signInAndChoose, ownerSession, otherProcess, type OtherProcess } from '../support/control-plane.ts';
import { createApp } from '../../src/http/app.ts';
import { serviceAuth, serviceAuthOf, KEY_TTL_MS } from '../../src/http/service-auth.ts';
import type { Deps } from '../../src/deps.ts';
import { withTransaction } from '../../src/db/pool.ts';

type App = { url: string; close(): Promise<void> };

async function serviceApp(deps: Deps): Promise<App> {
  const router = express.Router();
  router.post('/:tenancy/:namespace/v1/chat/completions', serviceAuth(deps, 'use'), (_req, res) => {
    const auth = serviceAuthOf(res);
    res.json({
      id: 'chatcmpl-test',
      object: 'chat.completion',
      created: 0,
      model: 'test-model',
      choices: [{ index: 0, message: { role: 'assistant', content: auth.apiKeyPrefix }, finish_reason: 'stop' }],
      sarsen_auth: auth,
    });
  });
  router.post('/:tenancy/:namespace/v1/messages', serviceAuth(deps, 'use'), (_req, res) => {
    const auth = serviceAuthOf(res);
    res.json({
      id: 'msg_test',
      type: 'message',
      role: 'assistant',
      model: 'test-model',
      content: [{ type: 'text', text: auth.apiKeyPrefix }],
      stop_reason: 'end_turn',
      stop_sequence: null,
      usage: { input_tokens: 1, output_tokens: 1 },
    });
  });
  router.get('/:tenancy/:namespace/v1/usage', serviceAuth(deps, 'manage'), (_req, res) => {
    res.json(serviceAuthOf(res));
  });
  const app = createApp({ ready: async () => true, routers: [router] });
  const server = http.createServer(app);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const release = track('server', 'service-auth test app');
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      release();
    },
  };
}

describe('service-route authentication', () => {
  let server: TestServer;
  let other: OtherProcess;
  let app: App;
  let ownerToken: string;
  const keys: Record<string, { key: string; api_key_id: string; prefix: string }> = {};
  let mainNamespaceId: string;
  let tenancyId: string;

  async function makeKey(tenancy: string, token: string, ns: string, name: string, grants: string[]) {
    const res = await call(server.url, 'POST', `/${tenancy}/v1/namespaces/${ns}/api-keys`, { token, body: { name, grants } });
    expect(res.status, res.text).to.equal(201);
    registerSecret(res.body.key);
    return res.body as { key: string; api_key_id: string; prefix: string };
  }

  before(async () => {
    server = await startTestServer();
    const acme = await signInAndChoose(server.url, await createTenancy(server.pool, 'acme'));
    ownerToken = acme.token;
    tenancyId = acme.account.tenancy_id;
    mainNamespaceId = (await call(server.url, 'POST', '/acme/v1/namespaces', { token: ownerToken, body: { name: 'main' } })).body.namespace_id;
    await call(server.url, 'POST', '/acme/v1/namespaces', { token: ownerToken, body: { name: 'side' } });
    const globex = await ownerSession(server, 'globex');
    await call(server.url, 'POST', '/globex/v1/namespaces', { token: globex.token, body: { name: 'main' } });

    keys.use = await makeKey('acme', ownerToken, 'main', 'use', ['use']);
    keys.manage = await makeKey('acme', ownerToken, 'main', 'manage', ['use', 'manage']);
    keys.side = await makeKey('acme', ownerToken, 'side', 'side', ['use', 'manage']);
    keys.globex = await makeKey('globex', globex.token, 'main', 'globex', ['use', 'manage']);
    keys.revoked = await makeKey('acme', ownerToken, 'main', 'revoked', ['use']);
    expect((await call(server.url, 'DELETE', `/acme/v1/namespaces/main/api-keys/${keys.revoked.api_key_id}`, { token: ownerToken })).status).to.equal(204);

    other = await otherProcess(server);
    app = await serviceApp(other.deps);
  });
  after(async () => {
    await app?.close();
    await other?.close();
    await server?.close();
  });

  const chat = (headers: Record<string, string>, path = '/acme/main/v1/chat/completions') =>
    call(app.url, 'POST', path, { headers, body: { model: 'm', messages: [] } });

  it('accepts a key as Authorization: Bearer and names the caller in res.locals.auth', async () => {
    const res = await chat({ authorization: `Bearer ${keys.manage.key}` });
    expect(res.status, res.text).to.equal(200);
    expect(res.body.sarsen_auth).to.deep.equal({
      tenancyId,
      tenancySlug: 'acme',
      namespaceId: mainNamespaceId,
      namespaceName: 'main',
      apiKeyId: keys.manage.api_key_id,
      apiKeyPrefix: keys.manage.prefix,
      grants: ['use', 'manage'],
      // A key with no rate limits, in a namespace without the response cache.
      limits: null,
      cacheTtlMinutes: null,
    });
  });

  it('accepts a key in X-Sarsen-Key', async () => {
    const res = await chat({ 'x-sarsen-key': keys.use.key });
    expect(res.status).to.equal(200);
    expect(res.body.sarsen_auth.apiKeyId).to.equal(keys.use.api_key_id);
  });

  it('lets X-Sarsen-Key win when Authorization carries another credential', async () => {
    const provider = `sk-ant-api03-${crypto.randomBytes(16).toString('hex')}`;
    registerSecret(provider);
    const ok = await chat({ 'x-sarsen-key': keys.use.key, authorization: `Bearer ${provider}` });
    expect(ok.status).to.equal(200);
    expect(ok.body.sarsen_auth.apiKeyId).to.equal(keys.use.api_key_id);
    // X-Sarsen-Key is the key even when it is wrong: no falling back to Authorization.
    const wrong = await chat({ 'x-sarsen-key': 'sar_nope', authorization: 'Bearer sk-proj-abc' });
    expect(wrong.status).to.equal(401);
  });

  it('refuses a Sarsen key in a header the provider would read with 400 sarsen_key_forwarded', async () => {
    const cases: Record<string, string>[] = [
      { 'x-api-key': keys.use.key },
      { 'x-api-key': 'sar_truncated' },
      { 'x-api-key': keys.use.key, 'x-sarsen-key': keys.use.key },
      { 'x-sarsen-key': keys.use.key, authorization: `Bearer ${keys.use.key}` },
      { 'x-sarsen-key': keys.use.key, authorization: keys.manage.key },
      { authorization: `Bearer ${keys.use.key}`, 'anthropic-beta': keys.use.key },
      { authorization: `Bearer ${keys.use.key}`, 'openai-organization': keys.use.key },
    ];
    for (const headers of cases) {
      const res = await chat(headers);
      expect(res.status, JSON.stringify(Object.keys(headers))).to.equal(400);
      expect(res.body.error.code).to.equal('sarsen_key_forwarded');
      expect(res.body.error.message).to.include('X-Sarsen-Key');
      expect(res.text).not.to.include(keys.use.key);
    }
  });

  it('refuses a provider credential as the bearer with 401 provider_credential naming both places', async () => {
    const provider = `sk-ant-api03-${crypto.randomBytes(16).toString('hex')}`;
    registerSecret(provider);
    const res = await chat({ authorization: `Bearer ${provider}` });
    expect(res.status).to.equal(401);
    expect(res.body.error.code).to.equal('provider_credential');
    expect(res.body.error.message).to.include('X-Sarsen-Key').and.to.include('Authorization: Bearer');
    expect(res.text).not.to.include(provider);
  });

  it('answers missing, malformed, unknown, wrong-secret, revoked, other-namespace and other-tenancy keys with one identical 401', async () => {
    const parsedUse = keys.use.key.split('_');
    const wrongSecret = `sar_${parsedUse[1]}_${crypto.randomBytes(32).toString('base64url').replace(/[-_]/g, 'x').slice(0, 43)}`;
    const unknown = `sar_${'Zz9'.repeat(3).slice(0, 8)}_${'a'.repeat(43)}`;
    const variants: [string, Record<string, string>][] = [
      ['missing', {}],
      ['empty bearer', { authorization: 'Bearer ' }],
      ['basic scheme', { authorization: 'Basic dXNlcjpwYXNz' }],
      ['malformed bearer', { authorization: 'Bearer not-a-key' }],
      ['malformed sarsen key', { authorization: 'Bearer sar_short_secret' }],
      ['malformed in X-Sarsen-Key', { 'x-sarsen-key': 'sar_' }],
      ['unknown', { authorization: `Bearer ${unknown}` }],
      ['wrong secret', { authorization: `Bearer ${wrongSecret}` }],
      ['revoked', { authorization: `Bearer ${keys.revoked.key}` }],
      ['other namespace', { authorization: `Bearer ${keys.side.key}` }],
      ['other tenancy', { 'x-sarsen-key': keys.globex.key }],
    ];
    const answers = [];
    for (const [, headers] of variants) answers.push(await chat(headers));
    for (const [i, a] of answers.entries()) {
      expect(a.status, variants[i]![0]).to.equal(401);
      expect(a.text, variants[i]![0]).to.equal(answers[0]!.text);
      expect(a.headers.get('content-type'), variants[i]![0]).to.equal(answers[0]!.headers.get('content-type'));
    }
    expect(answers[0]!.body.error.code).to.equal('unauthorised');
    // The same keys are good on their own paths.
    expect((await chat({ authorization: `Bearer ${keys.side.key}` }, '/acme/side/v1/chat/completions')).status).to.equal(200);
    expect((await chat({ 'x-sarsen-key': keys.globex.key }, '/globex/main/v1/chat/completions')).status).to.equal(200);
  });

  it('answers 403 forbidden for a valid key without the grant', async () => {
    const denied = await call(app.url, 'GET', '/acme/main/v1/usage', { headers: { 'x-sarsen-key': keys.use.key } });
    expect(denied.status).to.equal(403);
    expect(denied.body.error.code).to.equal('forbidden');
    const allowed = await call(app.url, 'GET', '/acme/main/v1/usage', { headers: { 'x-sarsen-key': keys.manage.key } });
    expect(allowed.status).to.equal(200);
    expect(allowed.body.grants).to.deep.equal(['use', 'manage']);
  });

  it('leaves unknown service paths to the 404 handler', async () => {
    const res = await call(app.url, 'GET', '/acme/main/v1/models', { headers: { 'x-sarsen-key': keys.use.key } });
    expect(res.status).to.equal(404);
    expect((await call(app.url, 'GET', '/acme/main/v1/models')).status).to.equal(404);
  });

  it('costs no database round trip per request in the steady state', async () => {
    await chat({ 'x-sarsen-key': keys.manage.key });
    const before = other.queries().length;
    for (let i = 0; i < 25; i++) expect((await chat({ 'x-sarsen-key': keys.manage.key })).status).to.equal(200);
    expect(other.queries().slice(before)).to.deep.equal([]);
  });

  it('stops accepting a revoked key at once: the revocation\'s notification drops it from the cache', async () => {
    const k = await makeKey('acme', ownerToken, 'main', 'short-lived', ['use']);
    expect((await chat({ 'x-sarsen-key': k.key })).status).to.equal(200); // now cached in the other process
    // Subscribed after the cache: the cache has handled a notification before this hears it.
    let heard = false;
    const off = other.deps.bus.subscribe('api-key', (msg) => void (heard ||= msg.prefix === k.prefix));
    try {
      expect((await call(server.url, 'DELETE', `/acme/v1/namespaces/main/api-keys/${k.api_key_id}`, { token: ownerToken })).status).to.equal(204);
      while (!heard) await sleep(10);
      expect((await chat({ 'x-sarsen-key': k.key })).status).to.equal(401);
    } finally {
      off();
    }
  });

  it(`stops accepting a key revoked without a notification once it has been cached for ${KEY_TTL_MS} ms`, async () => {
    const k = await makeKey('acme', ownerToken, 'main', 'missed', ['use']);
    expect((await chat({ 'x-sarsen-key': k.key })).status).to.equal(200);
    const cachedBy = Date.now(); // the other process cached the key at this time or before
    await withTransaction(server.pool, async (tx) => {
      await tx.query('SET LOCAL session_replication_role = replica'); // the notification is missed
      await tx.query('UPDATE sarsen.api_keys SET revoked_at = now() WHERE id = $1', [k.api_key_id]);
    });
    await sleep(Math.max(0, cachedBy + KEY_TTL_MS - Date.now()));
    expect((await chat({ 'x-sarsen-key': k.key })).status).to.equal(401);
  });

  it('works with the official SDKs: openai and @anthropic-ai/sdk send the key as a bearer', async () => {
    const openai = new OpenAI({ apiKey: keys.use.key, baseURL: `${app.url}/acme/main/v1`, maxRetries: 0 });
    const completion = await openai.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });
    expect(completion.choices[0]!.message.content).to.equal(keys.use.prefix);

    const anthropic = new Anthropic({ apiKey: keys.use.key, baseURL: `${app.url}/acme/main`, maxRetries: 0 });
    const message = await anthropic.messages.create({ model: 'm', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] });
    expect(message.content[0]).to.deep.include({ type: 'text', text: keys.use.prefix });

    // A provider credential as the SDK's key, the Sarsen key beside it.
    const provider = `sk-ant-api03-${crypto.randomBytes(16).toString('hex')}`;
    registerSecret(provider);
    const passthrough = new Anthropic({
      apiKey: provider,
      baseURL: `${app.url}/acme/main`,
      maxRetries: 0,
      defaultHeaders: { 'X-Sarsen-Key': keys.manage.key },
    });
    const m2 = await passthrough.messages.create({ model: 'm', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] });
    expect(m2.content[0]).to.deep.include({ text: keys.manage.prefix });

    const misconfigured = new Anthropic({ apiKey: provider, baseURL: `${app.url}/acme/main`, maxRetries: 0 });
    const err = await misconfigured.messages.create({ model: 'm', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] }).then(
      () => null,
      (e: unknown) => e as InstanceType<typeof Anthropic.APIError>,
    );
    expect(err).to.be.instanceOf(Anthropic.APIError);
    expect(err!.status).to.equal(401);
    expect(JSON.stringify(err!.error)).to.include('provider_credential');
  });

  it('records last_used_at with one coalesced write, flushed on close', async () => {
    const proc = await otherProcess(server);
    const local = await serviceApp(proc.deps);
    try {
      for (let i = 0; i < 10; i++) {
        expect((await call(local.url, 'POST', '/acme/main/v1/chat/completions', { headers: { 'x-sarsen-key': keys.use.key }, body: {} })).status).to.equal(200);
        expect((await call(local.url, 'POST', '/acme/main/v1/chat/completions', { headers: { 'x-sarsen-key': keys.manage.key }, body: {} })).status).to.equal(200);
      }
      expect(proc.queries().filter((q) => q.includes('last_used_at'))).to.have.length(0);
    } finally {
      await local.close();
      await proc.close();
    }
    expect(proc.queries().filter((q) => q.includes('last_used_at'))).to.have.length(1);
    const { rows } = await server.pool.query('SELECT id, last_used_at FROM sarsen.api_keys WHERE id = ANY($1)', [[keys.use.api_key_id, keys.manage.api_key_id]]);
    for (const r of rows) expect(r.last_used_at.getTime()).to.be.closeTo(Date.now(), 60_000);
    const listed = await call(server.url, 'GET', '/acme/v1/namespaces/main/api-keys', { token: ownerToken });
    expect(listed.body.data.find((k: any) => k.api_key_id === keys.use.api_key_id).last_used_at).to.be.a('string');
  });
});
