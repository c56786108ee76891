import { expect } from 'chai';
import { setTimeout as sleep } from 'node:timers/promises';
import { startTestServer, type TestServer } from '../support/server.ts';
import { call, ownerSession, otherProcess, type OtherProcess } from '../support/control-plane.ts';
import { resolveModel, type Resolution } from '../../src/control/resolve-model.ts';
import { withTransaction } from '../../src/db/pool.ts';

async function eventually(check: () => Promise<boolean>, what: string, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await sleep(20);
  }
}

const routed = (r: Resolution) => (r !== null && 'rule' in r ? r : null);

describe('control plane: routing rules', () => {
  let server: TestServer;
  let token: string;
  let namespaceId: string;
  let chat: string;
  let messages: string;
  const base = '/acme/v1/namespaces/main/routing-rules';
  const post = (body: unknown) => call(server.url, 'POST', base, { token, body });
  const patch = (id: string, body: unknown) => call(server.url, 'PATCH', `${base}/${id}`, { token, body });

  before(async () => {
    server = await startTestServer();
    token = (await ownerSession(server, 'acme')).token;
    namespaceId = (await call(server.url, 'POST', '/acme/v1/namespaces', { token, body: { name: 'main' } })).body.namespace_id;
    const bk = (body: unknown) => call(server.url, 'POST', '/acme/v1/namespaces/main/backends', { token, body });
    chat = (await bk({ name: 'chat', kind: 'chat_compat', address: 'http://127.0.0.1:1/v1' })).body.backend_id;
    messages = (await bk({ name: 'messages', kind: 'messages', address: 'http://127.0.0.1:2' })).body.backend_id;
  });
  after(async () => {
    await server?.close();
  });

  describe('routes', () => {
    it('creates a routing rule with defaults and answers it', async () => {
      const res = await post({ model: 'gpt-4o', backend_id: chat });
      expect(res.status).to.equal(201);
      expect(res.body).to.have.all.keys('rule_id', 'model', 'backend_id', 'fallback_backend_ids', 'rewrite_model', 'priority', 'action', 'created_at');
      expect(res.body.fallback_backend_ids).to.deep.equal([]);
      expect(res.body).to.include({ model: 'gpt-4o', backend_id: chat, rewrite_model: null, priority: 0, action: 'route' });
      expect(res.body.rule_id).to.match(/^rule_/);
      expect((await call(server.url, 'GET', `${base}/${res.body.rule_id}`, { token })).body).to.deep.equal(res.body);
      const list = await call(server.url, 'GET', base, { token });
      expect(list.body.data.map((r: any) => r.rule_id)).to.include(res.body.rule_id);
    });

    it('creates a declining rule with no backend', async () => {
      const res = await post({ model: 'forbidden-*', action: 'decline' });
      expect(res.status).to.equal(201);
      expect(res.body).to.include({ action: 'decline', backend_id: null });
    });

    it('refuses malformed rules with 400 naming the field', async () => {
      const cases: [unknown, string][] = [
        [{ model: 'm' }, 'backend_id'],
        [{ model: 'm', backend_id: null }, 'backend_id'],
        [{ model: 'm', action: 'decline', backend_id: chat }, 'backend_id'],
        [{ model: 'm', action: 'decline', rewrite_model: 'x' }, 'rewrite_model'],
        [{ model: '', backend_id: chat }, 'model'],
        [{ backend_id: chat }, 'model'],
        [{ model: 'm', backend_id: chat, priority: 1.5 }, 'priority'],
        [{ model: 'm', backend_id: chat, priority: '1' }, 'priority'],
        [{ model: 'm', backend_id: chat, action: 'reroute' }, 'action'],
        [{ model: 'm', backend_id: chat, rewrite_model: '' }, 'rewrite_model'],
        [{ model: 'm', backend_id: chat, weight: 3 }, 'weight'],
      ];
      for (const [body, field] of cases) {
        const res = await post(body);
        expect(res.status, JSON.stringify(body)).to.equal(400);
        expect(res.body.error.code).to.equal('bad_request');
        expect(res.body.error.message, JSON.stringify(body)).to.include(field);
      }
    });

    it('answers 404 for a backend that is not in this namespace', async () => {
      await call(server.url, 'POST', '/acme/v1/namespaces', { token, body: { name: 'elsewhere' } });
      const foreign = await call(server.url, 'POST', '/acme/v1/namespaces/elsewhere/backends', {
        token,
        body: { name: 'b', kind: 'chat_compat', address: 'http://127.0.0.1:3' },
      });
      for (const backend_id of [foreign.body.backend_id, 'bk_01ARZ3NDEKTSV4RRFFQ69G5FAV', 'nonsense']) {
        const res = await post({ model: 'm', backend_id });
        expect(res.status, backend_id).to.equal(404);
        expect(res.body.error.code).to.equal('not_found');
      }
    });

    it('patches a rule, turns it into a decline, and deletes it', async () => {
      const rule = (await post({ model: 'patch-me', backend_id: chat })).body;
      const p1 = await patch(rule.rule_id, { priority: 7, rewrite_model: 'patched-model', model: 'patch-me-*' });
      expect(p1.status).to.equal(200);
      expect(p1.body).to.include({ priority: 7, rewrite_model: 'patched-model', model: 'patch-me-*', backend_id: chat });
      const p2 = await patch(rule.rule_id, { backend_id: messages, rewrite_model: null });
      expect(p2.body).to.include({ backend_id: messages, rewrite_model: null });
      const declined = await patch(rule.rule_id, { action: 'decline' });
      expect(declined.status).to.equal(200);
      expect(declined.body).to.include({ action: 'decline', backend_id: null, rewrite_model: null });
      expect((await patch(rule.rule_id, { action: 'route' })).status).to.equal(400);
      const back = await patch(rule.rule_id, { action: 'route', backend_id: chat });
      expect(back.body).to.include({ action: 'route', backend_id: chat });
      expect((await patch(rule.rule_id, { backend_id: 'bk_01ARZ3NDEKTSV4RRFFQ69G5FAV' })).status).to.equal(404);
      expect((await patch('rule_01ARZ3NDEKTSV4RRFFQ69G5FAV', { priority: 1 })).status).to.equal(404);
      expect((await call(server.url, 'DELETE', `${base}/${rule.rule_id}`, { token })).status).to.equal(204);
      expect((await call(server.url, 'GET', `${base}/${rule.rule_id}`, { token })).status).to.equal(404);
      expect((await call(server.url, 'DELETE', `${base}/${rule.rule_id}`, { token })).status).to.equal(404);
    });
  });

  describe('resolveModel', () => {
    let other: OtherProcess;
    let ns: string;
    let rulesBase: string;
    let c: string;
    let m: string;
    before(async () => {
      other = await otherProcess(server);
      ns = (await call(server.url, 'POST', '/acme/v1/namespaces', { token, body: { name: 'resolve' } })).body.namespace_id;
      rulesBase = '/acme/v1/namespaces/resolve/routing-rules';
      const bk = (body: unknown) => call(server.url, 'POST', '/acme/v1/namespaces/resolve/backends', { token, body });
      c = (await bk({ name: 'chat', kind: 'aggregator', address: 'http://127.0.0.1:1/api/v1' })).body.backend_id;
      m = (await bk({ name: 'messages', kind: 'messages', address: 'http://127.0.0.1:2' })).body.backend_id;
      const rule = async (body: unknown) => {
        const res = await call(server.url, 'POST', rulesBase, { token, body });
        expect(res.status, res.text).to.equal(201);
      };
      await rule({ model: '*', backend_id: c });
      await rule({ model: 'claude-*', backend_id: m });
      await rule({ model: 'claude-3-*', backend_id: c, priority: 5, rewrite_model: 'anthropic/claude-3' });
      await rule({ model: 'claude-3-*', backend_id: m, priority: 1 });
      await rule({ model: 'claude-3-opus', backend_id: m });
      await rule({ model: 'blocked-*', action: 'decline' });
    });
    after(async () => {
      await other?.close();
    });

    it('applies the resolution order: exact, longest literal, priority; declines; null on no match', async () => {
      const exact = routed(await resolveModel(other.deps, ns, 'claude-3-opus'))!;
      expect(exact.rule.model).to.equal('claude-3-opus');
      expect(exact.backend).to.include({ backend_id: m, dialect: 'messages', kind: 'messages', address: 'http://127.0.0.1:2', namespace_id: ns });

      const byPriority = routed(await resolveModel(other.deps, ns, 'claude-3-haiku'))!;
      expect(byPriority.rule).to.include({ model: 'claude-3-*', priority: 5, rewrite_model: 'anthropic/claude-3' });
      expect(byPriority.backend).to.include({ backend_id: c, dialect: 'chat', kind: 'aggregator' });

      const longer = routed(await resolveModel(other.deps, ns, 'claude-sonnet-4'))!;
      expect(longer.rule.model).to.equal('claude-*');

      const fallback = routed(await resolveModel(other.deps, ns, 'gpt-4o'))!;
      expect(fallback.rule.model).to.equal('*');

      const declined = await resolveModel(other.deps, ns, 'blocked-model');
      expect(declined).to.have.property('declined');
      expect((declined as { declined: { model: string } }).declined.model).to.equal('blocked-*');

      const empty = (await call(server.url, 'POST', '/acme/v1/namespaces', { token, body: { name: 'no-rules' } })).body.namespace_id;
      expect(await resolveModel(other.deps, empty, 'gpt-4o')).to.equal(null);
    });

    it('costs no database round trip once the namespace is cached', async () => {
      await resolveModel(other.deps, ns, 'warm-up');
      const before = other.queries().length;
      for (let i = 0; i < 50; i++) await resolveModel(other.deps, ns, `model-${i}`);
      expect(other.queries().length).to.equal(before);
    });

    it('shares one read between concurrent misses', async () => {
      const cold = (await call(server.url, 'POST', '/acme/v1/namespaces', { token, body: { name: 'cold' } })).body.namespace_id;
      const before = other.queries().length;
      await Promise.all(Array.from({ length: 20 }, () => resolveModel(other.deps, cold, 'x')));
      expect(other.queries().length - before).to.equal(1);
    });

    it('sees rule and backend changes made by another process', async () => {
      expect(routed(await resolveModel(other.deps, ns, 'gpt-4o'))!.rule.model).to.equal('*');
      const added = await call(server.url, 'POST', rulesBase, { token, body: { model: 'gpt-4o', backend_id: m, rewrite_model: 'gpt-4o-2024' } });
      await eventually(async () => routed(await resolveModel(other.deps, ns, 'gpt-4o'))?.rule.model === 'gpt-4o', 'the new rule is seen');

      await call(server.url, 'PATCH', `/acme/v1/namespaces/resolve/backends/${m}`, { token, body: { address: 'http://127.0.0.1:4/moved' } });
      await eventually(
        async () => routed(await resolveModel(other.deps, ns, 'gpt-4o'))?.backend.address === 'http://127.0.0.1:4/moved',
        'the moved backend is seen',
      );

      await call(server.url, 'DELETE', `${rulesBase}/${added.body.rule_id}`, { token });
      await eventually(async () => routed(await resolveModel(other.deps, ns, 'gpt-4o'))?.rule.model === '*', 'the deletion is seen');
    });

    it('drops the whole cache when the bus reconnects (a missed notification)', async () => {
      const rule = await call(server.url, 'POST', rulesBase, { token, body: { model: 'silent', backend_id: c } });
      await eventually(async () => routed(await resolveModel(other.deps, ns, 'silent'))?.backend.backend_id === c, 'the rule is seen');
      // The rule's own notification may still be on its way (the cache can have read the rule
      // first): let it land and the cache refill before the silent change.
      await sleep(200);
      expect(routed(await resolveModel(other.deps, ns, 'silent'))!.backend.backend_id).to.equal(c);
      // A change no notification announces (triggers off for this session only).
      await withTransaction(server.pool, async (tx) => {
        await tx.query(`SET LOCAL session_replication_role = replica`);
        await tx.query('UPDATE sarsen.routing_rules SET backend_id = $2 WHERE id = $1', [rule.body.rule_id, m]);
      });
      await sleep(200);
      expect(routed(await resolveModel(other.deps, ns, 'silent'))!.backend.backend_id).to.equal(c, 'served from the cache');
      // Cut every bus connection; both processes reconnect and must re-read.
      await server.pool.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'sarsen-bus %' AND datname = current_database()`);
      await eventually(async () => routed(await resolveModel(other.deps, ns, 'silent'))?.backend.backend_id === m, 'the cache is dropped');
    });
  });
});
