// Accounting (issue 7): the listing, usage, storage, the fee ledger and credit metering.
import { expect } from 'chai';
import crypto from 'node:crypto';
import net from 'node:net';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatCompletionBody, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json, until } from '../support/http.ts';
import { call } from '../support/control-plane.ts';
import { recountStorage, grantCredit, setPrice } from '../../src/db/accounting.ts';
import { foldCounters } from '../../src/db/counters.ts';
import { newId } from '../../src/core/ids.ts';
import { setSetting } from '../../src/config/settings.ts';

const get = (t: Tenant, path: string, key = t.key) => rawRequest(`${t.base}${path}`, { headers: { 'x-sarsen-key': key } });
const submit = (t: Tenant, body: object, path = '/chat/completions', key = t.key) =>
  rawRequest(`${t.base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': key }, body: JSON.stringify(body) });
const chat = (content: string, extra: object = {}) => ({ model: 'gpt-test', messages: [{ role: 'user', content }], ...extra });

describe('accounting', function () {
  this.timeout(120_000);
  let provider: FakeProvider;
  let server: TestServer;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer({ settings: { request_fee_micros: 1000 } });
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });
  beforeEach(() => provider.reset());

  describe('GET /requests', () => {
    let t: Tenant;
    before(async () => {
      t = await provision(server, provider);
    });

    it('needs the manage grant', async () => {
      const { key } = await t.newKey(['use']);
      const res = await get(t, '/requests', key);
      expect(res.status).to.equal(403);
      expect(json(res).error.code).to.equal('forbidden');
      for (const path of ['/usage', '/storage']) expect((await get(t, path, key)).status).to.equal(403);
    });

    it('refuses limit 0, above 200, negative, non-integer or repeated, and a garbage or foreign cursor, with 400', async () => {
      for (const q of ['limit=0', 'limit=201', 'limit=-1', 'limit=1.5', 'limit=abc', 'limit=', 'limit=1&limit=2', 'after=garbage', 'after=abc.def']) {
        const res = await get(t, `/requests?${q}`);
        expect(res.status, q).to.equal(400);
        expect(json(res).error.code).to.equal('bad_request');
      }
      expect((await get(t, '/requests?limit=200')).status).to.equal(200);
      expect((await get(t, '/requests?limit=1')).status).to.equal(200);
      const other = await provision(server, provider);
      await seed(other, 3);
      const foreign = json(await get(other, '/requests?limit=1')).next_after;
      expect(foreign).to.be.a('string');
      expect((await get(t, `/requests?after=${encodeURIComponent(foreign)}`)).status).to.equal(400);
    });

    it('rows carry the listing fields and no body or answer', async () => {
      const res = await submit(t, chat('listed'));
      expect(res.status).to.equal(200);
      const { data, next_after } = json(await get(t, '/requests?limit=1'));
      expect(next_after === null || typeof next_after === 'string').to.equal(true);
      const row = data[0];
      expect(Object.keys(row)).to.deep.equal([
        'request_id', 'status', 'model', 'dialect', 'streaming', 'api_key_id', 'api_key_prefix', 'backend_id', 'prompt_tokens',
        'completion_tokens', 'total_tokens', 'cost', 'stored_bytes', 'attempts', 'recoveries', 'created_at', 'started_at', 'finished_at', 'expired', 'cached_from', 'batch_id',
      ]);
      expect(row).to.include({ status: 'succeeded', model: 'gpt-test', dialect: 'chat', streaming: false, api_key_id: t.apiKeyId, backend_id: t.backends.chat, cost: 1000, expired: false });
      expect(row.api_key_prefix).to.equal(t.key.split('_')[1]);
      expect(row.stored_bytes).to.equal(Buffer.byteLength(JSON.stringify(chat('listed'))) + res.body.length);
      expect(JSON.stringify(data)).to.not.include('listed');
    });

    it('pages through 1,000 rows newest first, none skipped or repeated while new rows arrive', async () => {
      const fresh = await provision(server, provider);
      const seeded = await seed(fresh, 1000);
      const seen: string[] = [];
      let after: string | null = null;
      let pages = 0;
      do {
        const res = await get(fresh, `/requests?limit=137${after ? `&after=${encodeURIComponent(after)}` : ''}`);
        expect(res.status).to.equal(200);
        const body = json(res);
        seen.push(...body.data.map((r: { request_id: string }) => r.request_id));
        after = body.next_after;
        if (++pages === 2) await seed(fresh, 50); // newer rows land while we page
      } while (after);
      const expected = [...seeded].sort().reverse();
      expect(seen).to.deep.equal(expected);
      expect(new Set(seen).size).to.equal(seen.length);
    });
  });

  /** Rows for listing tests, written as the submission path writes them. */
  async function seed(t: Tenant, n: number): Promise<string[]> {
    const ids = Array.from({ length: n }, () => newId('req'));
    await server.pool.query(
      `INSERT INTO sarsen.requests (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model, status)
       SELECT s.id, n.tenancy_id, n.id, $3, $4, 'chat', false, 'gpt-seeded', 'gpt-seeded', 'succeeded'
         FROM unnest($1::text[]) AS s(id), sarsen.namespaces n WHERE n.id = $2`,
      [ids, t.namespaceId, t.apiKeyId, t.backends.chat],
    );
    return ids;
  }

  describe('GET /usage', () => {
    it('counts submissions and provider calls apart: attaches are submissions, failures released and re-sent are two calls and two fees', async () => {
      const t = await provision(server, provider);
      const before = json(await get(t, '/usage'));
      expect(before).to.include({ namespace_id: t.namespaceId, accepted_submissions: 0, provider_calls: 0, upstream_sent_bytes: 0, upstream_received_bytes: 0 });
      expect(before.api_keys).to.deep.equal([]);

      const body = chat('counted');
      await Promise.all([submit(t, body), submit(t, body), submit(t, body)]); // one execution, two attaches
      provider.enqueue({ kind: 'refuse', status: 400, body: '{"error":"no"}' });
      const failing = chat('fails then runs');
      expect((await submit(t, failing)).status).to.equal(400);
      expect((await submit(t, failing)).status).to.equal(200);

      const usage = json(await get(t, '/usage'));
      expect(usage.accepted_submissions).to.equal(5);
      expect(usage.provider_calls).to.equal(3);
      // Sent bytes are what the provider's sockets read: request lines and headers included.
      expect(usage.upstream_sent_bytes).to.equal(provider.bytesReceived());
      expect(usage.upstream_sent_bytes).to.be.greaterThan(provider.journal.reduce((n, e) => n + e.body.length, 0));
      expect(usage.upstream_received_bytes).to.be.greaterThan(0);
      expect(usage.api_keys).to.have.length(1);
      expect(usage.api_keys[0]).to.include({ api_key_id: t.apiKeyId, ledger_events: 5, provider_calls: 3 });

      const ledger = await server.pool.query(`SELECT kind, amount_micros FROM sarsen.ledger WHERE namespace_id = $1 ORDER BY id`, [t.namespaceId]);
      const kinds = ledger.rows.map((r) => `${r.kind}:${r.amount_micros}`).sort();
      expect(kinds).to.deep.equal(['attach:0', 'attach:0', 'execution:1000', 'execution:1000', 'execution:1000']);
    });

    it('a call that reached no provider is no provider call and sent nothing; one that reached it counts once, whatever its attempts', async () => {
      const t = await provision(server, provider);
      // A backend on a port nothing listens on: every attempt's connection is refused.
      const closed = net.createServer();
      await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
      const port = (closed.address() as net.AddressInfo).port;
      await new Promise<void>((resolve) => closed.close(() => resolve()));
      const nsPath = `/${t.tenancy}/v1/namespaces/${t.namespace}`;
      const backend = await call(server.url, 'POST', `${nsPath}/backends`, {
        token: t.adminToken,
        body: { name: 'nowhere', kind: 'chat_compat', address: `http://127.0.0.1:${port}/v1`, credential: 'sk-nowhere' },
      });
      expect(backend.status).to.equal(201);
      const rule = await call(server.url, 'POST', `${nsPath}/routing-rules`, { token: t.adminToken, body: { model: 'nowhere-*', backend_id: backend.body.backend_id } });
      expect(rule.status).to.equal(201);
      await setSetting(server.pool, 'retry_base_ms', '10');
      await server.settings.refresh();
      try {
        const refused = json(await submit(t, { ...chat('refused everywhere'), model: 'nowhere-1' }, '/requests'));
        const record = await until(async () => {
          const r = json(await get(t, `/requests/${refused.request_id}`));
          return r.status === 'failed' ? r : undefined;
        });
        expect(record.attempts).to.equal(3);
        expect(record.error.error.code).to.equal('upstream_failed');
        let usage = json(await get(t, '/usage'));
        expect(usage).to.include({ accepted_submissions: 1, provider_calls: 0, upstream_sent_bytes: 0, upstream_received_bytes: 0 });
        expect(usage.api_keys).to.deep.equal([{ api_key_id: t.apiKeyId, ledger_events: 1, provider_calls: 0, prompt_tokens: null, completion_tokens: null, total_tokens: null, cache_hits: 0 }]);

        // Reached, and cut off before any answer, three times: one provider call, every byte counted.
        provider.enqueue({ kind: 'drop' }, { kind: 'drop' }, { kind: 'drop' });
        expect((await submit(t, chat('dropped'))).status).to.equal(502);
        usage = json(await get(t, '/usage'));
        expect(provider.journal).to.have.length(3);
        expect(usage).to.include({ accepted_submissions: 2, provider_calls: 1, upstream_sent_bytes: provider.bytesReceived() });
        expect(usage.api_keys[0]).to.include({ ledger_events: 2, provider_calls: 1 });
      } finally {
        await setSetting(server.pool, 'retry_base_ms', '1000');
        await server.settings.refresh();
      }
    });

    it('token sums are null when no answer under the key reported one, and 0 when a provider reported zero', async () => {
      const t = await provision(server, provider);
      const zero = await t.newKey(['use', 'manage']);
      const silent = { id: 'x', object: 'chat.completion', choices: [] };
      provider.enqueue({ kind: 'json', body: silent }, { kind: 'json', body: chatCompletionBody('z', { promptTokens: 0, completionTokens: 0 }) });
      await submit(t, chat('no usage'));
      await submit(t, chat('zero usage'), '/chat/completions', zero.key);
      // A stream without include_usage reports nothing either.
      provider.enqueue({ kind: 'sse', frames: chatFrames(['a', 'b']) });
      await submit(t, chat('stream without usage', { stream: true }));
      const usage = json(await get(t, '/usage'));
      const byKey = Object.fromEntries(usage.api_keys.map((k: { api_key_id: string }) => [k.api_key_id, k]));
      expect(byKey[t.apiKeyId]).to.deep.equal({ api_key_id: t.apiKeyId, ledger_events: 2, provider_calls: 2, prompt_tokens: null, completion_tokens: null, total_tokens: null, cache_hits: 0 });
      expect(byKey[zero.apiKeyId]).to.deep.equal({ api_key_id: zero.apiKeyId, ledger_events: 1, provider_calls: 1, prompt_tokens: 0, completion_tokens: 0, total_tokens: 0, cache_hits: 0 });
    });

    it('echoes the window start exactly: thirty days ago by default, `since` to the millisecond; a bad `since` is 400', async () => {
      const t = await provision(server, provider);
      await submit(t, chat('windowed'));
      const DAY = 86_400_000;
      const before = Date.now();
      const usage = json(await get(t, '/usage'));
      expect(usage.itemised_since).to.be.within(before - 30 * DAY, Date.now() - 30 * DAY);
      expect(usage.api_keys).to.have.length(1);
      const since = Date.now() - 90 * 60_000 + 1234;
      const narrow = json(await get(t, `/usage?since=${since}`));
      expect(narrow.itemised_since).to.equal(since);
      expect(narrow.api_keys).to.have.length(1);
      const future = json(await get(t, `/usage?since=${Date.now() + 2 * 3_600_000}`));
      expect(future.api_keys).to.deep.equal([]);
      expect(future.accepted_submissions).to.equal(1); // the totals are all-time, whatever the window
      for (const bad of ['abc', '-5', '1.5', '']) expect((await get(t, `/usage?since=${bad}`)).status, bad).to.equal(400);
    });

    it('itemises exactly from `since`: whole hours from the hourly rows, the partial hour from the events, to the millisecond', async () => {
      const t = await provision(server, provider);
      const tokens = (n: number) => chatCompletionBody('x', { promptTokens: n, completionTokens: 1 });
      provider.enqueue({ kind: 'json', body: tokens(100) }, { kind: 'json', body: tokens(20) }, { kind: 'json', body: tokens(3) });
      expect((await submit(t, chat('before the window'))).status).to.equal(200); // settled before `cut`
      await new Promise((r) => setTimeout(r, 5));
      const cut = Date.now();
      await new Promise((r) => setTimeout(r, 5));
      expect((await submit(t, chat('inside the window'))).status).to.equal(200);
      // Two hours back, whole hours, so the hour `cut` falls in is a past hour whose hourly row
      // holds both requests: only the events can tell them apart.
      await server.pool.query(`UPDATE sarsen.ledger SET created_at = created_at - interval '2 hours' WHERE namespace_id = $1`, [t.namespaceId]);
      await server.pool.query(
        `UPDATE sarsen.requests SET created_at = created_at - interval '2 hours', started_at = started_at - interval '2 hours',
                finished_at = finished_at - interval '2 hours' WHERE namespace_id = $1`,
        [t.namespaceId],
      );
      // (The hourly figures, folded or not yet: src/db/counters.ts.)
      await foldCounters(server.pool);
      await server.pool.query(
        `WITH folded AS (UPDATE sarsen.key_usage_hourly SET hour = hour - interval '2 hours' WHERE namespace_id = $1)
         UPDATE sarsen.key_usage_deltas SET hour = hour - interval '2 hours' WHERE namespace_id = $1`,
        [t.namespaceId],
      );
      expect((await submit(t, chat('now'))).status).to.equal(200); // this hour's row
      const since = cut - 2 * 3_600_000;

      const usage = json(await get(t, `/usage?since=${since}`));
      expect(usage.itemised_since).to.equal(since);
      expect(usage.api_keys).to.deep.equal([
        { api_key_id: t.apiKeyId, ledger_events: 2, provider_calls: 2, prompt_tokens: 23, completion_tokens: 2, total_tokens: 25, cache_hits: 0 },
      ]);
      const all = json(await get(t, `/usage?since=${since - 3_600_000}`));
      expect(all.api_keys[0]).to.include({ ledger_events: 3, provider_calls: 3, prompt_tokens: 123 });

      // To the millisecond: a window starting at an event includes it, one a millisecond later does not.
      const { rows } = await server.pool.query(
        `SELECT floor(extract(epoch FROM l.created_at) * 1000)::bigint AS at FROM sarsen.ledger l JOIN sarsen.requests q ON q.id = l.request_id
          WHERE l.namespace_id = $1 ORDER BY l.created_at LIMIT 1 OFFSET 1`,
        [t.namespaceId],
      );
      const accepted = Number(rows[0].at); // the second request's acceptance, shifted
      expect(json(await get(t, `/usage?since=${accepted}`)).api_keys[0].ledger_events).to.equal(2);
      expect(json(await get(t, `/usage?since=${accepted + 1}`)).api_keys[0].ledger_events).to.equal(1);
    });
  });

  describe('GET /storage', () => {
    it('equals a full recount after answers, streams, failures and attaches', async () => {
      const t = await provision(server, provider);
      await submit(t, chat('stored'));
      await submit(t, chat('stored')); // attach: no new body
      provider.enqueue({ kind: 'refuse', status: 429, body: '{"error":"slow down"}' }, { kind: 'refuse', status: 429 }, { kind: 'refuse', status: 418, body: '{"error":"teapot"}' });
      await server.settings.refresh();
      await submit(t, chat('refused'));
      provider.enqueue({ kind: 'sse', frames: chatFrames(['one', 'two', 'three'], { usage: true }) });
      await submit(t, chat('streamed', { stream: true }));
      provider.enqueue({ kind: 'sse', frames: chatFrames(['x', 'y', 'z']), dropAfter: 2 });
      await submit(t, chat('cut', { stream: true }));
      const storage = json(await get(t, '/storage'));
      const recount = await recountStorage(server.pool, t.namespaceId);
      expect(storage).to.deep.equal({
        namespace_id: t.namespaceId,
        stored_bytes: recount.request_bytes + recount.response_bytes + recount.chunk_bytes,
        ...recount,
        // No batch files or waiting batch lines here (docs/api.md "Batches").
        file_bytes: 0,
        batch_bytes: 0,
      });
      expect(recount.request_bytes).to.be.greaterThan(0);
      expect(recount.response_bytes).to.be.greaterThan(0);
      expect(recount.chunk_bytes).to.be.greaterThan(0);
    });
  });

  describe('metering', () => {
    let metered: TestServer;
    let t: Tenant;
    before(async () => {
      metered = await startTestServer({ settings: { metering_enabled: true, request_fee_micros: 100 } });
      t = await provision(metered, provider);
    });
    after(async () => {
      await metered?.close();
    });

    it('402 insufficient_credits without credit; the fee is debited once per execution, never for an attach', async () => {
      const refused = await submit(t, chat('broke'));
      expect(refused.status).to.equal(402);
      expect(json(refused).error.code).to.equal('insufficient_credits');
      expect(provider.journal).to.have.length(0);
      expect(await grantCredit(metered.pool, t.tenancy, 250)).to.equal(250);
      expect((await submit(t, chat('paid'))).status).to.equal(200);
      expect((await submit(t, chat('paid'))).status).to.equal(200); // attach: free
      const billing = await call(metered.url, 'GET', `/${t.tenancy}/v1/billing`, { token: t.adminToken });
      expect(billing.body).to.deep.equal({ tenancy_id: billing.body.tenancy_id, balance_micros: 150, metering_enabled: true });
      const ledger = await call(metered.url, 'GET', `/${t.tenancy}/v1/billing/ledger?limit=1`, { token: t.adminToken });
      expect(ledger.body.data[0]).to.include({ kind: 'attach', amount_micros: 0 });
      const next = await call(metered.url, 'GET', `/${t.tenancy}/v1/billing/ledger?limit=1&after=${encodeURIComponent(ledger.body.next_after)}`, { token: t.adminToken });
      expect(next.body.data[0]).to.include({ kind: 'execution', amount_micros: 100 });
      expect((await call(metered.url, 'GET', `/${t.tenancy}/v1/billing/ledger?after=nope`, { token: t.adminToken })).status).to.equal(400);
    });

    it('charges tokens at the model\'s price and shows the cost on the row', async () => {
      await grantCredit(metered.pool, t.tenancy, 1_000_000);
      await setPrice(metered.pool, 'gpt-priced', 2_000_000, 4_000_000); // 2 and 4 micro-credits a token
      provider.enqueue({ kind: 'json', body: chatCompletionBody('p', { promptTokens: 10, completionTokens: 5 }) });
      expect((await submit(t, { ...chat('priced'), model: 'gpt-priced' })).status).to.equal(200);
      const row = json(await get(t, '/requests?limit=1')).data[0];
      expect(row.cost).to.equal(100 + 10 * 2 + 5 * 4);
    });

    it('402 spend_limit_reached at a key\'s cap, exactly, under concurrency', async () => {
      await grantCredit(metered.pool, t.tenancy, 1_000_000);
      const capped = await call(metered.url, 'POST', `/${t.tenancy}/v1/namespaces/${t.namespace}/api-keys`, {
        token: t.adminToken,
        body: { name: `capped-${crypto.randomBytes(3).toString('hex')}`, grants: ['use'], spend_limit: 300 },
      });
      const key = capped.body.key as string;
      const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => submit(t, chat(`cap ${i}`), '/requests', key)));
      const accepted = answers.filter((a) => a.status === 202).length;
      const refusals = answers.filter((a) => a.status === 402);
      expect(accepted).to.equal(3);
      expect(refusals).to.have.length(17);
      for (const r of refusals) expect(json(r).error.code).to.equal('spend_limit_reached');
    });

    it('402 spend_limit_reached at the namespace\'s cap', async () => {
      const fresh = await provision(metered, provider);
      await grantCredit(metered.pool, fresh.tenancy, 1_000_000);
      const patched = await call(metered.url, 'PATCH', `/${fresh.tenancy}/v1/namespaces/${fresh.namespace}`, { token: fresh.adminToken, body: { spend_limit: 100 } });
      expect(patched.status).to.equal(200);
      expect((await submit(fresh, chat('one'), '/requests')).status).to.equal(202);
      const over = await submit(fresh, chat('two'), '/requests');
      expect(over.status).to.equal(402);
      expect(json(over).error.code).to.equal('spend_limit_reached');
      expect(json(over).error.message).to.include('namespace');
      await until(async () => (json(await get(fresh, '/requests?limit=1')).data[0].status === 'succeeded' ? true : undefined));
    });

    it('with metering off neither 402 appears, whatever the credit', async () => {
      const free = await provision(server, provider); // the unmetered server; this tenancy has no credit
      expect((await submit(free, chat('free'))).status).to.equal(200);
    });
  });
});
