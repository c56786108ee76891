// Every code of the error table (src/core/errors.ts, docs/api.md "Errors") provoked over a real
// socket, on the real server and database, and answered with its status and the envelope
// {"error": {"code", "message"}} (issue 41). The table of cases is typed by the codes, so a code
// added without a case here does not type-check. Two faults are made inside PostgreSQL by a
// trigger, as nothing a caller sends can make them: an unexpected database error (500
// internal) and the SQLSTATE a standby answers a write with (503 unavailable; a real outage is
// db-outage.test.ts's, a real standby standby-start.test.ts's).
import { expect } from 'chai';
import crypto from 'node:crypto';
import { ERROR_CODES, type ErrorCode } from '../../src/core/errors.ts';
import { HOPS_HEADER } from '../../src/core/header-policy.ts';
import { setSetting } from '../../src/config/settings.ts';
import { grantCredit } from '../../src/db/accounting.ts';
import { runRetentionSweep } from '../../src/executor/retention.ts';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json, until, type RawResponse } from '../support/http.ts';
import { call, createTenancy, signIn } from '../support/control-plane.ts';

const HOLD_MS = 2000;
// The answers that say when to try again (docs/api.md "Errors").
const RETRY_AFTER = new Set<ErrorCode>(['rate_limited', 'too_many_attempts', 'unavailable']);

describe('every error code over HTTP', function () {
  this.timeout(120_000);
  let provider: FakeProvider;
  let server: TestServer; // credential passthrough on
  let plain: TestServer; // a second process on the same database, passthrough off
  let t: Tenant;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer({ credentialPassthrough: true, settings: { synchronous_hold_ms: HOLD_MS, retry_base_ms: 10, retry_max_ms: 50, max_attempts: 2, shutdown_grace_ms: 200 } });
    plain = await startTestServer({ db: server.db });
    t = await provision(server, provider);
    // Hangs until cancelled or abandoned: the provider call of a held caller.
    provider.rule((e) => (JSON.stringify(e.json ?? '').includes('hang-') ? { kind: 'hang' } : undefined));
  });
  after(async () => {
    await plain?.close();
    await server?.close();
    await provider?.close();
  });

  const chat = (content: string, model = 'gpt-test') => JSON.stringify({ model, messages: [{ role: 'user', content }] });
  const submit = (path: string, body: string, headers: Record<string, string> = { 'x-sarsen-key': t.key }, tenant = t) =>
    rawRequest(`${tenant.base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  const admin = (method: string, path: string, body?: unknown, tenant = t, url = server.url) => call(url, method, `/${tenant.tenancy}/v1${path}`, { token: tenant.adminToken, body });
  /** Runs `fn` with these settings, then puts the previous values back. */
  const withSettings = async <T>(values: Record<string, string>, fn: () => Promise<T>): Promise<T> => {
    const current = server.settings.current() as unknown as Record<string, unknown>;
    const before = Object.fromEntries(Object.keys(values).map((name) => [name, JSON.stringify(current[name])]));
    const apply = async (v: Record<string, string>) => {
      for (const [name, value] of Object.entries(v)) await setSetting(server.pool, name, value);
      await Promise.all([server.settings.refresh(), plain.settings.refresh()]);
    };
    await apply(values);
    try {
      return await fn();
    } finally {
      await apply(before);
    }
  };
  const unique = () => crypto.randomBytes(4).toString('hex');
  /** The request holding `marker` in its body, once it is stored. */
  const requestWith = (marker: string) =>
    until(async () => {
      const { rows } = await server.pool.query(`SELECT q.id FROM sarsen.requests q JOIN sarsen.request_bodies b ON b.request_id = q.id WHERE b.body LIKE $1`, [`%${marker}%`]);
      return rows[0]?.id as string | undefined;
    });
  /** A database fault on inserting a namespace of this name: an unexpected error, or a standby's refusal. */
  const faultOnNamespace = (name: string, sqlstate: string) =>
    server.pool.query(`
      CREATE FUNCTION public.fault_${sqlstate.toLowerCase()}() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN IF NEW.name = '${name}' THEN RAISE EXCEPTION 'injected fault' USING ERRCODE = '${sqlstate}'; END IF; RETURN NEW; END $$;
      CREATE TRIGGER fault_${sqlstate.toLowerCase()} BEFORE INSERT ON sarsen.namespaces FOR EACH ROW EXECUTE FUNCTION public.fault_${sqlstate.toLowerCase()}();`);

  const CASES: Record<ErrorCode, () => Promise<RawResponse | Awaited<ReturnType<typeof call>>>> = {
    bad_request: () => submit('/requests', '{"model": "gpt-test", '),
    sarsen_key_forwarded: () => submit('/chat/completions', chat('forwarded'), { 'x-sarsen-key': t.key, 'x-api-key': t.key }),
    unauthorised: () => submit('/requests', chat('no key'), {}),
    provider_credential: () => submit('/chat/completions', chat('provider key'), { authorization: `Bearer sk-ant-api03-${unique()}${unique()}` }),
    caller_credential_missing: async () => {
      const backend = await admin('POST', `/namespaces/${t.namespace}/backends`, { name: `caller-${unique()}`, kind: 'chat_compat', address: `${provider.url}/v1`, credential_source: 'caller' });
      expect(backend.status, backend.text).to.equal(201);
      expect((await admin('POST', `/namespaces/${t.namespace}/routing-rules`, { model: 'caller-*', action: 'route', backend_id: backend.body.backend_id })).status).to.equal(201);
      return submit('/chat/completions', chat('no credential', 'caller-model'));
    },
    insufficient_credits: async () => {
      const broke = await provision(server, provider); // a tenancy with no credit
      return withSettings({ metering_enabled: 'true' }, () => submit('/requests', chat(`broke ${unique()}`), { 'x-sarsen-key': broke.key }, broke));
    },
    spend_limit_reached: () =>
      withSettings({ metering_enabled: 'true', request_fee_micros: '100' }, async () => {
        await grantCredit(server.pool, t.tenancy, 1_000_000);
        const capped = await admin('POST', `/namespaces/${t.namespace}/api-keys`, { name: `capped-${unique()}`, grants: ['use'], spend_limit: 100 });
        expect((await submit('/requests', chat(`capped ${unique()}`), { 'x-sarsen-key': capped.body.key })).status).to.equal(202);
        return submit('/requests', chat(`capped ${unique()}`), { 'x-sarsen-key': capped.body.key });
      }),
    forbidden: async () => {
      expect((await admin('POST', `/namespaces/${t.namespace}/routing-rules`, { model: 'declined-*', action: 'decline' })).status).to.equal(201);
      return submit('/requests', chat('declined', 'declined-model'));
    },
    password_change_required: async () => {
      const account = await createTenancy(server.pool, `unchosen-${unique()}`);
      const token = await signIn(server.url, account);
      return call(server.url, 'GET', `/${account.tenancy}/v1/users`, { token });
    },
    password_rejected: () => admin('POST', '/account/password', { current_password: 'not the password at all', new_password: `new-${unique()}-${unique()}` }),
    not_found: () => rawRequest(`${t.base}/requests/req_01ARZ3NDEKTSV4RRFFQ69G5FAV`, { headers: { 'x-sarsen-key': t.key } }),
    conflict: () => admin('POST', '/namespaces', { name: t.namespace }),
    record_expired: async () => {
      expect((await admin('PATCH', `/namespaces/${t.namespace}`, { retention_minutes: 10 })).status).to.equal(200);
      try {
        const id = json(await submit('/requests', chat(`expiring ${unique()}`))).request_id as string;
        await until(async () => ((await server.pool.query(`SELECT status FROM sarsen.requests WHERE id = $1`, [id])).rows[0].status === 'succeeded' ? true : undefined));
        await server.pool.query(`UPDATE sarsen.requests SET finished_at = now() - interval '11 minutes' WHERE id = $1`, [id]);
        await runRetentionSweep(server);
        return await rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key } });
      } finally {
        await admin('PATCH', `/namespaces/${t.namespace}`, { retention_minutes: null });
      }
    },
    body_too_large: () => submit('/requests', JSON.stringify({ model: 'gpt-test', padding: 'x'.repeat(2 * 1024 * 1024) })),
    unsupported_media_type: () => rawRequest(`${t.base}/requests`, { method: 'POST', headers: { 'content-type': 'text/plain', 'x-sarsen-key': t.key }, body: chat('plain text') }),
    unprocessable_entity: () => submit('/chat/completions', chat('wrong dialect', 'claude-test')),
    backend_host_refused: () =>
      withSettings({ backends_public_only: 'true' }, () =>
        admin('POST', `/namespaces/${t.namespace}/backends`, { name: `private-${unique()}`, kind: 'chat_compat', address: 'http://10.0.0.1/v1', credential: `sk-${unique()}` })),
    passthrough_disabled: () =>
      admin('POST', `/namespaces/${t.namespace}/backends`, { name: `caller-off-${unique()}`, kind: 'chat_compat', address: `${provider.url}/v1`, credential_source: 'caller' }, t, plain.url),
    rate_limited: async () => {
      const limited = await admin('POST', `/namespaces/${t.namespace}/api-keys`, { name: `limited-${unique()}`, grants: ['use'], limits: { requests_per_minute: 1 } });
      expect(limited.status, limited.text).to.equal(201);
      const key = { 'x-sarsen-key': limited.body.key as string };
      // Two in one minute of the database's clock: the second is over the limit whichever minute the first counted in.
      const answers = [await submit('/requests', chat(`limited ${unique()}`), key), await submit('/requests', chat(`limited ${unique()}`), key), await submit('/requests', chat(`limited ${unique()}`), key)];
      return answers.find((a) => a.status !== 202)!;
    },
    too_many_attempts: () =>
      withSettings({ sign_in_failures_per_account_address: '2' }, async () => {
        const email = `nobody-${unique()}@example.test`;
        const attempt = () => call(server.url, 'POST', `/${t.tenancy}/v1/sessions`, { body: { email, password: 'wrong password' } });
        for (let i = 0; i < 2; i++) expect((await attempt()).status).to.equal(401);
        return attempt();
      }),
    cancelled: async () => {
      const marker = `hang-cancel-${unique()}`;
      const held = submit('/chat/completions', chat(marker));
      const id = await requestWith(marker);
      await provider.waitUntil(() => provider.journal.some((e) => JSON.stringify(e.json ?? '').includes(marker)));
      // 202: the running attempt is told to stop; the held caller gets the cancelled answer.
      expect((await rawRequest(`${t.base}/requests/${id}/cancel`, { method: 'POST', headers: { 'x-sarsen-key': t.key } })).status).to.be.oneOf([200, 202]);
      return held;
    },
    internal: async () => {
      await faultOnNamespace('fault-internal', 'P0001');
      return admin('POST', '/namespaces', { name: 'fault-internal' });
    },
    upstream_failed: async () => {
      const down = await admin('POST', `/namespaces/${t.namespace}/backends`, { name: `down-${unique()}`, kind: 'chat_compat', address: 'http://127.0.0.1:1/v1', credential: `sk-${unique()}` });
      expect((await admin('POST', `/namespaces/${t.namespace}/routing-rules`, { model: 'down-*', action: 'route', backend_id: down.body.backend_id })).status).to.equal(201);
      return submit('/chat/completions', chat(`unreachable ${unique()}`, 'down-model'));
    },
    unavailable: async () => {
      await faultOnNamespace('fault-standby', '25006'); // read_only_sql_transaction
      return admin('POST', '/namespaces', { name: 'fault-standby' });
    },
    held_too_long: () => submit('/chat/completions', chat(`hang-hold-${unique()}`)),
    loop_detected: () => submit('/requests', chat('looped'), { 'x-sarsen-key': t.key, [HOPS_HEADER]: '1000' }),
  };

  for (const code of Object.keys(ERROR_CODES) as ErrorCode[]) {
    it(`${ERROR_CODES[code].status} ${code}`, async () => {
      const res = await CASES[code]();
      // Two shapes of answer: the control-plane helper's (fetch) and rawRequest's (node:http).
      const [body, text, retryAfter] =
        'text' in res ? [res.body, res.text, res.headers.get('retry-after')] : [json(res), res.body.toString('utf8'), res.headers['retry-after']];
      expect(res.status, text).to.equal(ERROR_CODES[code].status);
      expect(Object.keys(body), text).to.deep.equal(['error']);
      expect(Object.keys(body.error)).to.deep.equal(['code', 'message']);
      expect(body.error.code).to.equal(code);
      expect(body.error.message).to.be.a('string').and.not.equal('');
      if (RETRY_AFTER.has(code)) expect(retryAfter, 'Retry-After').to.match(/^\d+$/);
    });
  }
});
