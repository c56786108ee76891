// Helpers for control-plane tests: an HTTP caller, tenancies with signed-in owners, and a
// second in-process "Sarsen process" (its own pool, bus and caches) on a test server's
// database, for what the HTTP routes cannot show (caches, resolveModel, serviceAuth).
import type { TestServer } from './server.ts';
import { registerSecret } from './log-guard.ts';
import { testPool } from './db.ts';
import { track } from './resources.ts';
import { withTransaction } from '../../src/db/pool.ts';
import { createTenancyWithOwner } from '../../src/cli/tenancy.ts';
import { insertUser, type Role } from '../../src/db/tenancies.ts';
import { generatePassword, hashPassword } from '../../src/core/passwords.ts';
import { newId } from '../../src/core/ids.ts';
import { createBus } from '../../src/bus/bus.ts';
import { createSettingsCache } from '../../src/config/settings.ts';
import { createKeyring } from '../../src/core/sealing.ts';
import type { Deps } from '../../src/deps.ts';
import { closeServiceAuth } from '../../src/http/service-auth.ts';
import { closeRouting } from '../../src/control/resolve-model.ts';
import { createSubmitter } from '../../src/http/service/submitter.ts';
import type pg from 'pg';

export type Answer = { status: number; text: string; body: any; headers: Headers };

export type CallOptions = { token?: string; body?: unknown; raw?: string; headers?: Record<string, string> };

/** One HTTP call to `base + path`; JSON bodies are sent as application/json. */
export async function call(base: string, method: string, path: string, opts: CallOptions = {}): Promise<Answer> {
  const headers: Record<string, string> = { ...opts.headers };
  if (opts.token !== undefined) headers.authorization = `Bearer ${opts.token}`;
  let payload: string | undefined;
  if (opts.raw !== undefined) payload = opts.raw;
  else if (opts.body !== undefined) payload = JSON.stringify(opts.body);
  if (payload !== undefined && !Object.keys(headers).some((h) => h.toLowerCase() === 'content-type')) {
    headers['content-type'] = 'application/json';
  }
  const res = await fetch(base + path, { method, headers, body: payload });
  const text = await res.text();
  let body: any = undefined;
  try {
    body = text === '' ? undefined : JSON.parse(text);
  } catch {
    body = undefined;
  }
  return { status: res.status, text, body, headers: res.headers };
}

export type Account = { tenancy: string; tenancy_id: string; email: string; password: string; user_id: string };

/** A tenancy and its owner, straight into the database (as `sarsen tenancy create` does). */
export async function createTenancy(pool: pg.Pool, slug: string, email = `owner@${slug}.test`): Promise<Account> {
  const password = generatePassword();
  registerSecret(password);
  const passwordHash = await hashPassword(password);
  const t = await withTransaction(pool, (tx) => createTenancyWithOwner(tx, { slug, ownerEmail: email, passwordHash }));
  return { tenancy: slug, tenancy_id: t.tenancy_id, email, password, user_id: t.owner_id };
}

/** Another account in an existing tenancy; `chosen` false leaves the password unchosen. */
export async function addUser(pool: pg.Pool, tenancy: Account, email: string, role: Role, chosen = true): Promise<Account> {
  const password = generatePassword();
  registerSecret(password);
  const u = await insertUser(pool, {
    id: newId('usr'),
    tenancy_id: tenancy.tenancy_id,
    email,
    password_hash: await hashPassword(password),
    role,
    password_chosen: chosen,
  });
  return { ...tenancy, email, password, user_id: u.id };
}

export async function signIn(url: string, a: Pick<Account, 'tenancy' | 'email' | 'password'>): Promise<string> {
  const res = await call(url, 'POST', `/${a.tenancy}/v1/sessions`, { body: { email: a.email, password: a.password } });
  if (res.status !== 201) throw new Error(`sign-in failed: ${res.status} ${res.text}`);
  registerSecret(res.body.token);
  return res.body.token as string;
}

/** Signs in and replaces an unchosen password; answers the token (still valid) and the new password. */
export async function signInAndChoose(url: string, a: Account): Promise<{ token: string; account: Account }> {
  const token = await signIn(url, a);
  const chosen = `chosen-${generatePassword()}`;
  registerSecret(chosen);
  const res = await call(url, 'POST', `/${a.tenancy}/v1/account/password`, {
    token,
    body: { current_password: a.password, new_password: chosen },
  });
  if (res.status !== 204) throw new Error(`password change failed: ${res.status} ${res.text}`);
  return { token, account: { ...a, password: chosen } };
}

/** A tenancy with an owner who is signed in with a chosen password. */
export async function ownerSession(server: TestServer, slug: string): Promise<{ token: string; account: Account }> {
  return signInAndChoose(server.url, await createTenancy(server.pool, slug));
}

export type OtherProcess = { deps: Deps; queries: () => string[]; close(): Promise<void> };

/**
 * Deps as a second Sarsen process would build them, on the test server's database and with
 * its secrets. `queries()` lists the SQL this "process" sent, to prove what a cache saves.
 */
export async function otherProcess(server: TestServer, opts: { credentialPassthrough?: boolean } = {}): Promise<OtherProcess> {
  const pool = testPool(server.db.conn, 4);
  const sent: string[] = [];
  const query = pool.query.bind(pool) as (...args: unknown[]) => unknown;
  (pool as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
    const first = args[0];
    sent.push(typeof first === 'string' ? first : String((first as { text?: unknown })?.text));
    return query(...args);
  };
  const processId = newId('wrk');
  const bus = createBus(server.db.conn, { origin: processId });
  const releaseBus = track('bus', server.db.name);
  await bus.ready();
  const settings = await createSettingsCache(pool, bus);
  const deps: Deps = Object.freeze({
    processId,
    conn: server.db.conn,
    pool,
    bus,
    settings,
    secrets: server.secrets,
    serve: { role: 'api' as const, credentialPassthrough: opts.credentialPassthrough ?? false, port: 0, host: '127.0.0.1', executorConcurrency: 1 },
    keyring: createKeyring([{ version: 1, secret: server.secrets.credentialKey }]),
    submitter: createSubmitter(server.db.conn, pool, settings, null),
  });
  return {
    deps,
    queries: () => [...sent],
    async close() {
      await closeServiceAuth(deps);
      closeRouting(deps);
      await deps.submitter.close();
      settings.close();
      await bus.close();
      releaseBus();
      await pool.end();
    },
  };
}

export type RouteCase = {
  name: string;
  method: 'GET' | 'POST' | 'PATCH' | 'DELETE';
  path: string;
  /** Least role that may call it. */
  role: Role;
  body?: () => unknown;
  /** Succeeding would destroy a fixture: role tests check only the refusal. */
  destructive?: boolean;
};

export type Fixture = { ns: string; backend_id: string; rule_id: string; api_key_id: string; user_id: string };

let unique = 0;
const fresh = (what: string) => `${what}-${process.pid}-${++unique}`;

/**
 * Every administration route except sign-in, sign-out and the password change, addressed at
 * the fixture's resources in tenancy `t`.
 */
export function everyAdminRoute(t: string, f: Fixture): RouteCase[] {
  const ns = `/${t}/v1/namespaces/${f.ns}`;
  return [
    { name: 'GET tenancy', method: 'GET', path: `/${t}/v1/tenancy`, role: 'owner' },
    { name: 'PATCH tenancy', method: 'PATCH', path: `/${t}/v1/tenancy`, role: 'owner', body: () => ({ display_name: 'Renamed' }) },
    { name: 'GET namespaces', method: 'GET', path: `/${t}/v1/namespaces`, role: 'viewer' },
    { name: 'POST namespaces', method: 'POST', path: `/${t}/v1/namespaces`, role: 'admin', body: () => ({ name: fresh('ns') }) },
    { name: 'GET namespace', method: 'GET', path: ns, role: 'viewer' },
    { name: 'PATCH namespace', method: 'PATCH', path: ns, role: 'admin', body: () => ({ retention_minutes: 60 }) },
    { name: 'DELETE namespace', method: 'DELETE', path: ns, role: 'admin', destructive: true },
    { name: 'GET backends', method: 'GET', path: `${ns}/backends`, role: 'viewer' },
    {
      name: 'POST backends',
      method: 'POST',
      path: `${ns}/backends`,
      role: 'admin',
      body: () => ({ name: fresh('bk'), kind: 'chat_compat', address: 'https://93.184.216.34/v1' }),
    },
    { name: 'GET backend', method: 'GET', path: `${ns}/backends/${f.backend_id}`, role: 'viewer' },
    { name: 'PATCH backend', method: 'PATCH', path: `${ns}/backends/${f.backend_id}`, role: 'admin', body: () => ({ kind: 'chat_compat' }) },
    { name: 'DELETE backend', method: 'DELETE', path: `${ns}/backends/${f.backend_id}`, role: 'admin', destructive: true },
    { name: 'GET routing-rules', method: 'GET', path: `${ns}/routing-rules`, role: 'viewer' },
    {
      name: 'POST routing-rules',
      method: 'POST',
      path: `${ns}/routing-rules`,
      role: 'admin',
      body: () => ({ model: fresh('model'), action: 'decline' }),
    },
    { name: 'GET routing-rule', method: 'GET', path: `${ns}/routing-rules/${f.rule_id}`, role: 'viewer' },
    { name: 'PATCH routing-rule', method: 'PATCH', path: `${ns}/routing-rules/${f.rule_id}`, role: 'admin', body: () => ({ priority: 1 }) },
    { name: 'DELETE routing-rule', method: 'DELETE', path: `${ns}/routing-rules/${f.rule_id}`, role: 'admin', destructive: true },
    { name: 'GET api-keys', method: 'GET', path: `${ns}/api-keys`, role: 'viewer' },
    { name: 'POST api-keys', method: 'POST', path: `${ns}/api-keys`, role: 'admin', body: () => ({ name: fresh('key'), grants: ['use'] }) },
    { name: 'GET api-key', method: 'GET', path: `${ns}/api-keys/${f.api_key_id}`, role: 'viewer' },
    { name: 'DELETE api-key', method: 'DELETE', path: `${ns}/api-keys/${f.api_key_id}`, role: 'admin', destructive: true },
    { name: 'GET users', method: 'GET', path: `/${t}/v1/users`, role: 'owner' },
    { name: 'POST users', method: 'POST', path: `/${t}/v1/users`, role: 'owner', body: () => ({ email: `${fresh('u')}@example.test`, role: 'viewer' }) },
    { name: 'PATCH user', method: 'PATCH', path: `/${t}/v1/users/${f.user_id}`, role: 'owner', body: () => ({ role: 'viewer' }) },
    { name: 'DELETE user', method: 'DELETE', path: `/${t}/v1/users/${f.user_id}`, role: 'owner', destructive: true },
  ];
}

/** Makes a namespace with one backend, one rule, one key and one extra (viewer) user. */
export async function makeFixture(url: string, account: Account, token: string, ns: string): Promise<Fixture> {
  const t = account.tenancy;
  const must = async (res: Promise<Answer>, status: number): Promise<any> => {
    const a = await res;
    if (a.status !== status) throw new Error(`fixture: expected ${status}, got ${a.status} ${a.text}`);
    return a.body;
  };
  await must(call(url, 'POST', `/${t}/v1/namespaces`, { token, body: { name: ns } }), 201);
  const base = `/${t}/v1/namespaces/${ns}`;
  const bk = await must(
    call(url, 'POST', `${base}/backends`, { token, body: { name: 'main', kind: 'chat_compat', address: 'https://93.184.216.34/v1' } }),
    201,
  );
  const rule = await must(call(url, 'POST', `${base}/routing-rules`, { token, body: { model: 'gpt-*', backend_id: bk.backend_id } }), 201);
  const key = await must(call(url, 'POST', `${base}/api-keys`, { token, body: { name: 'main', grants: ['use'] } }), 201);
  registerSecret(key.key);
  const user = await must(call(url, 'POST', `/${t}/v1/users`, { token, body: { email: `${fresh('viewer')}@example.test`, role: 'viewer' } }), 201);
  registerSecret(user.password);
  return { ns, backend_id: bk.backend_id, rule_id: rule.rule_id, api_key_id: key.api_key_id, user_id: user.user_id };
}
