// Rate limits per key (issue 32): set through the key's administration route, counted at
// acceptance inside the submission's group commit across every process, refused with
// 429 rate_limited and Retry-After (honoured by the openai and anthropic SDKs' own retries),
// tokens charged at the terminal write, and shown by /usage and /metrics.
import { expect } from 'chai';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import type pg from 'pg';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatCompletionBody, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { startDeployment, type Deployment, type SarsenProcess } from '../support/processes.ts';
import { rawRequest, json, type RawResponse } from '../support/http.ts';
import { call } from '../support/control-plane.ts';

const chat = (content: string) => ({ model: 'gpt-test', messages: [{ role: 'user', content }] });
const post = (t: Tenant, key: string, body: object, path = '/requests', base = t.base): Promise<RawResponse> =>
  rawRequest(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': key }, body: JSON.stringify(body) });
const usage = async (t: Tenant) => json(await rawRequest(`${t.base}/usage`, { headers: { 'x-sarsen-key': t.key } }));

/** A key with these limits, issued through the administration route. */
async function limitedKey(url: string, t: Tenant, limits: object): Promise<{ key: string; id: string }> {
  const res = await call(url, 'POST', `/${t.tenancy}/v1/namespaces/${t.namespace}/api-keys`, {
    token: t.adminToken,
    body: { name: `limited-${Math.random().toString(36).slice(2, 8)}`, grants: ['use'], limits },
  });
  expect(res.status, res.text).to.equal(201);
  return { key: res.body.key, id: res.body.api_key_id };
}

/**
 * Waits, when the database's current minute has less than `room` seconds left, for the next one:
 * a burst the test counts then falls in one window. (The wait is for a clock, never an assertion on one.)
 */
async function freshMinute(pool: pg.Pool, room = 15): Promise<void> {
  const { rows } = await pool.query<{ left: number }>(`SELECT extract(epoch FROM date_trunc('minute', now()) + interval '1 minute' - now())::float8 AS left`);
  if (rows[0]!.left < room) await sleep(rows[0]!.left * 1000 + 100);
}

/**
 * The provider calls made for these messages only: earlier tests' submissions to /requests run
 * on in the background and may reach the provider during a later test.
 */
const callsFor = (provider: FakeProvider, ...contents: string[]) =>
  provider.journal.filter((e) => contents.includes(e.json?.messages?.[0]?.content));

/** Waits until the database's current minute has at most 10 seconds left: an SDK's wait to the next one is then short. */
async function lateInMinute(pool: pg.Pool): Promise<void> {
  const { rows } = await pool.query<{ left: number }>(`SELECT extract(epoch FROM date_trunc('minute', now()) + interval '1 minute' - now())::float8 AS left`);
  if (rows[0]!.left > 12) await sleep((rows[0]!.left - 10) * 1000);
}

type Seen = { status: number; retryAfter: string | null; at: number; code?: string };

/** A fetch that records what the SDK itself received, try by try (a refusal's error code too). */
function watchedFetch(seen: Seen[]): typeof fetch {
  return async (url, init) => {
    const res = await fetch(url, init);
    const at = Date.now();
    const code = res.status === 429 ? ((await res.clone().json()) as { error?: { code?: string } }).error?.code : undefined;
    seen.push({ status: res.status, retryAfter: res.headers.get('retry-after'), at, code });
    return res;
  };
}

const countRequests = async (pool: pg.Pool, apiKeyId: string) =>
  (await pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM sarsen.requests WHERE api_key_id = $1`, [apiKeyId])).rows[0]!.n;

describe('rate limits per key', function () {
  this.timeout(180_000);
  let provider: FakeProvider;
  let server: TestServer;
  let t: Tenant;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer();
    t = await provision(server, provider);
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });
  beforeEach(() => provider.reset());

  describe('administration', () => {
    it('a key carries its limits: set at issue, changed by PATCH (also to none), refused when not positive integers', async () => {
      const keys = `/${t.tenancy}/v1/namespaces/${t.namespace}/api-keys`;
      const made = await call(server.url, 'POST', keys, { token: t.adminToken, body: { name: 'with-limits', grants: ['use'], limits: { requests_per_minute: 60 } } });
      expect(made.status).to.equal(201);
      expect(made.body.limits).to.deep.equal({ requests_per_minute: 60, tokens_per_minute: null });
      const id = made.body.api_key_id;
      const patched = await call(server.url, 'PATCH', `${keys}/${id}`, { token: t.adminToken, body: { limits: { requests_per_minute: 5, tokens_per_minute: 1000 } } });
      expect(patched.status).to.equal(200);
      expect(patched.body.limits).to.deep.equal({ requests_per_minute: 5, tokens_per_minute: 1000 });
      expect((await call(server.url, 'GET', `${keys}/${id}`, { token: t.adminToken })).body.limits).to.deep.equal({ requests_per_minute: 5, tokens_per_minute: 1000 });
      expect((await call(server.url, 'PATCH', `${keys}/${id}`, { token: t.adminToken, body: { limits: null } })).body.limits).to.deep.equal({ requests_per_minute: null, tokens_per_minute: null });
      for (const limits of [{ requests_per_minute: 0 }, { tokens_per_minute: -1 }, { requests_per_minute: 1.5 }, { requests_per_minute: '5' }, { per_hour: 5 }]) {
        const res = await call(server.url, 'PATCH', `${keys}/${id}`, { token: t.adminToken, body: { limits } });
        expect(res.status, JSON.stringify(limits)).to.equal(400);
        expect(res.body.error.code).to.equal('bad_request');
      }
      expect((await call(server.url, 'PATCH', `${keys}/${id}`, { token: t.adminToken, body: { grants: ['use', 'manage'] } })).status).to.equal(400);
      await call(server.url, 'DELETE', `${keys}/${id}`, { token: t.adminToken });
      expect((await call(server.url, 'PATCH', `${keys}/${id}`, { token: t.adminToken, body: { limits: null } })).status).to.equal(404);
    });
  });

  describe('requests per minute', () => {
    it('a burst gets exactly the limit through, in one group commit or many; the rest are 429 rate_limited with Retry-After, and no record', async () => {
      const k = await limitedKey(server.url, t, { requests_per_minute: 4 });
      await freshMinute(server.pool);
      const answers = await Promise.all(Array.from({ length: 12 }, (_, i) => post(t, k.key, chat(`burst ${i}`))));
      const accepted = answers.filter((a) => a.status === 202);
      const refused = answers.filter((a) => a.status === 429);
      expect(accepted).to.have.length(4);
      expect(refused).to.have.length(8);
      for (const r of refused) {
        expect(json(r).error.code).to.equal('rate_limited');
        expect(json(r).error.message).to.include('requests per minute');
        const after = Number(r.headers['retry-after']);
        expect(after).to.be.within(1, 60);
      }
      expect(await countRequests(server.pool, k.id)).to.equal(4);
      const { rows } = await server.pool.query(`SELECT count(*)::int AS n FROM sarsen.ledger WHERE api_key_id = $1`, [k.id]);
      expect(rows[0].n).to.equal(4);
    });

    it('an identical body that would attach counts too: every submission is counted at acceptance', async () => {
      const k = await limitedKey(server.url, t, { requests_per_minute: 2 });
      await freshMinute(server.pool);
      const first = await post(t, k.key, chat('attach counts'));
      const again = await post(t, k.key, chat('attach counts'));
      expect(json(again).request_id).to.equal(json(first).request_id);
      const third = await post(t, k.key, chat('attach counts'));
      expect(third.status).to.equal(429);
      expect(json(third).error.code).to.equal('rate_limited');
    });

    it('a key without limits writes no window and is never refused; the provider\'s own 429 still passes through unchanged', async () => {
      await Promise.all(Array.from({ length: 5 }, (_, i) => post(t, t.key, chat(`unlimited ${i}`))));
      const { rows } = await server.pool.query(`SELECT count(*)::int AS n FROM sarsen.key_windows WHERE api_key_id = $1`, [t.apiKeyId]);
      expect(rows[0].n).to.equal(0);
      // Retried (with no wait: retry-after 0) until the attempts run out, then passed through.
      const refusal = { kind: 'refuse' as const, status: 429, body: { error: { type: 'rate_limit', message: 'slow down' } }, retryAfter: '0' };
      const stop = provider.rule((e) => (e.json?.messages?.[0]?.content === 'provider refuses' ? refusal : undefined));
      const res = await post(t, t.key, chat('provider refuses'), '/chat/completions');
      stop();
      expect(res.status).to.equal(429);
      expect(res.headers['retry-after']).to.equal('0');
      expect(json(res)).to.deep.equal({ error: { type: 'rate_limit', message: 'slow down' } });
    });
  });

  describe('tokens per minute', () => {
    it('tokens are charged when a request settles; the submission after the one that crossed the limit is refused', async () => {
      const k = await limitedKey(server.url, t, { tokens_per_minute: 50 });
      await freshMinute(server.pool, 20);
      // By message, not queued: a late call of an earlier test's submission would take a queued answer.
      const answer = { kind: 'json' as const, body: JSON.stringify(chatCompletionBody('answer', { promptTokens: 20, completionTokens: 10 })) };
      provider.rule((e) => (['tokens 1', 'tokens 2', 'tokens 3'].includes(e.json?.messages?.[0]?.content) ? answer : undefined));
      expect((await post(t, k.key, chat('tokens 1'), '/chat/completions')).status).to.equal(200); // 30 tokens: under
      expect((await post(t, k.key, chat('tokens 2'), '/chat/completions')).status).to.equal(200); // 60: crosses 50
      const refused = await post(t, k.key, chat('tokens 3'), '/chat/completions');
      expect(refused.status).to.equal(429);
      expect(json(refused).error).to.include({ code: 'rate_limited' });
      expect(json(refused).error.message).to.include('tokens per minute');
      expect(Number(refused.headers['retry-after'])).to.be.within(1, 60);
      expect(callsFor(provider, 'tokens 1', 'tokens 2', 'tokens 3')).to.have.length(2);

      const window = (await usage(t)).rate_limits.find((w: { api_key_id: string }) => w.api_key_id === k.id);
      expect(window).to.deep.include({ api_key_id: k.id, requests_per_minute: null, tokens_per_minute: 50 });
      expect(window.window).to.include({ requests: 2, tokens: 60, refused: 1 });
      expect(Date.parse(window.window.started_at) % 60_000).to.equal(0);
    });

    it('a settle charging a key\'s tokens does not hold up that key\'s submissions: they read the tokens unlocked', async () => {
      const k = await limitedKey(server.url, t, { requests_per_minute: 1000, tokens_per_minute: 1_000_000 });
      await freshMinute(server.pool);
      expect((await post(t, k.key, chat('settled'), '/chat/completions')).status).to.equal(200);
      // A terminal write between its charge and its commit, held open.
      const settle = await server.pool.connect();
      try {
        await settle.query('BEGIN');
        const charged = await settle.query(`UPDATE sarsen.key_window_tokens SET tokens = tokens + 1 WHERE api_key_id = $1`, [k.id]);
        expect(charged.rowCount).to.equal(1);
        const accepted = post(t, k.key, chat('while a settle commits'));
        // The submission either answers or waits on a lock: whichever comes first decides.
        let decided = false;
        const waiting = async (): Promise<'waiting' | undefined> => {
          while (!decided) {
            const { rows } = await server.pool.query(`SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`);
            if (rows.length > 0) return 'waiting';
            await sleep(20);
          }
          return undefined;
        };
        const first = await Promise.race([accepted.then((r) => r.status), waiting()]);
        decided = true;
        await settle.query('ROLLBACK');
        await accepted;
        expect(first).to.equal(202);
      } finally {
        settle.release();
      }
    });
  });

  describe('usage and metrics', () => {
    it('/usage lists every live limited key with its current window; /metrics counts refusals by limit, never by key', async () => {
      const k = await limitedKey(server.url, t, { requests_per_minute: 1, tokens_per_minute: 1_000_000 });
      await freshMinute(server.pool);
      expect((await post(t, k.key, chat('metrics 1'))).status).to.equal(202);
      expect((await post(t, k.key, chat('metrics 2'))).status).to.equal(429);
      const entry = (await usage(t)).rate_limits.find((w: { api_key_id: string }) => w.api_key_id === k.id);
      expect(entry).to.deep.include({ requests_per_minute: 1, tokens_per_minute: 1_000_000 });
      expect(entry.window).to.include({ requests: 1, refused: 1 });
      const metrics = (await rawRequest(`${server.url}/metrics`)).body.toString('utf8');
      expect(metrics).to.match(/^sarsen_rate_limited_total\{limit="requests"\} [1-9]/m);
      expect(metrics).to.match(/^sarsen_submissions_total\{[^}]*outcome="refused",code="rate_limited"\} [1-9]/m);
      expect(metrics).to.not.include(k.id);
    });
  });

  /**
   * An SDK's two calls on a key limited to one a minute: the second was refused once with
   * Retry-After, retried by the SDK after it (not sooner), and accepted in the next window.
   */
  async function expectRetriedInNextWindow(seen: Seen[], apiKeyId: string): Promise<void> {
    expect(seen.map((s) => s.status)).to.deep.equal([200, 429, 200]);
    const wait = Number(seen[1]!.retryAfter);
    expect(wait).to.be.within(1, 60);
    expect(seen[2]!.at - seen[1]!.at).to.be.at.least(wait * 1000 - 50);
    const created = (await server.pool.query<{ minute: Date }>(`SELECT date_trunc('minute', created_at) AS minute FROM sarsen.requests WHERE api_key_id = $1 ORDER BY id`, [apiKeyId])).rows;
    expect(created).to.have.length(2);
    expect(created[1]!.minute.getTime()).to.be.greaterThan(created[0]!.minute.getTime());
  }

  describe('the vendor SDKs', () => {
    it('the openai and anthropic SDKs each retry a 429 rate_limited after its Retry-After on their own, and the call succeeds once the window has passed', async () => {
      const [ko, ka] = [await limitedKey(server.url, t, { requests_per_minute: 1 }), await limitedKey(server.url, t, { requests_per_minute: 1 })];
      // Start late in a minute, so the SDKs' wait (to the next minute) is short; both in one minute.
      await lateInMinute(server.pool);
      const viaOpenai = async () => {
        const seen: Seen[] = [];
        const openai = new OpenAI({ baseURL: t.base, apiKey: ko.key, maxRetries: 2, fetch: watchedFetch(seen) });
        const first = await openai.chat.completions.create(chat('sdk one') as OpenAI.ChatCompletionCreateParamsNonStreaming);
        expect(first.object).to.equal('chat.completion');
        const second = await openai.chat.completions.create(chat('sdk two') as OpenAI.ChatCompletionCreateParamsNonStreaming);
        expect(second.object).to.equal('chat.completion');
        await expectRetriedInNextWindow(seen, ko.id);
        // One provider call per request: the refused try reached none.
        expect(callsFor(provider, 'sdk one', 'sdk two')).to.have.length(2);
      };
      const viaAnthropic = async () => {
        const seen: Seen[] = [];
        const anthropic = new Anthropic({ baseURL: t.root, apiKey: ka.key, maxRetries: 2, fetch: watchedFetch(seen) });
        const message = (content: string) => ({ model: 'claude-test', max_tokens: 16, messages: [{ role: 'user' as const, content }] });
        const first = await anthropic.messages.create(message('anthropic sdk one'));
        expect(first.type).to.equal('message');
        const second = await anthropic.messages.create(message('anthropic sdk two'));
        expect(second.type).to.equal('message');
        await expectRetriedInNextWindow(seen, ka.id);
        expect(seen[1]!.code).to.equal('rate_limited');
        const calls = callsFor(provider, 'anthropic sdk one', 'anthropic sdk two');
        expect(calls.map((e) => e.path)).to.deep.equal(['/v1/messages', '/v1/messages']);
      };
      await Promise.all([viaOpenai(), viaAnthropic()]);
    });
  });
});

describe('rate limits across processes', function () {
  this.timeout(180_000);
  let provider: FakeProvider;
  let d: Deployment;
  let apis: SarsenProcess[];
  let t: Tenant;

  before(async () => {
    provider = await startFakeProvider();
    d = await startDeployment();
    apis = [await d.start('api'), await d.start('api')];
    t = await provision(d.asServer(apis[0]!), provider);
  });
  after(async () => {
    await d?.close();
    await provider?.close();
  });

  it('two api processes on one database hold one limit: a burst split across them gets exactly the limit through', async () => {
    const k = await limitedKey(apis[0]!.url, t, { requests_per_minute: 10 });
    await freshMinute(d.pool);
    const bases = apis.map((a) => `${a.url}/${t.tenancy}/${t.namespace}/v1`);
    const send = (p: number, i: number) => post(t, k.key, chat(`split ${i}`), '/requests', bases[p]);
    // Each process is sure to take part: one request to each while the window is empty (both
    // accept), the burst split across them, then one more to each once it is full (both refuse).
    const first = [await send(0, 0), await send(1, 1)];
    const burst = await Promise.all(Array.from({ length: 36 }, (_, i) => send(i % 2, 2 + i)));
    const last = [await send(0, 38), await send(1, 39)];
    const answers = [...first, ...burst, ...last];
    expect(answers.filter((a) => a.status === 202)).to.have.length(10);
    expect(answers.filter((a) => a.status === 429)).to.have.length(30);
    for (const a of answers) if (a.status !== 202) expect(json(a).error.code).to.equal('rate_limited');
    // Both processes accepted and refused from the same count.
    for (const p of [0, 1]) {
      const mine = answers.filter((_, i) => i % 2 === p);
      expect(mine.filter((a) => a.status === 202).length, `process ${p} accepted`).to.be.at.least(1);
      expect(mine.filter((a) => a.status === 429).length, `process ${p} refused`).to.be.at.least(1);
    }
    expect(await countRequests(d.pool, k.id)).to.equal(10);
    const { rows } = await d.pool.query(`SELECT requests, refused FROM sarsen.key_windows WHERE api_key_id = $1`, [k.id]);
    expect(rows[0]).to.deep.equal({ requests: 10, refused: 30 });
  });
});
