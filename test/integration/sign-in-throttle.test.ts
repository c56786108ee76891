// Sign-in throttling (issue 14): attempts counted per account and per client address in
// PostgreSQL, so every API process sharing the database enforces the same limits; 429 with
// Retry-After, the same whether or not the email exists.
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { createTenancy, type Account } from '../support/control-plane.ts';
import { rawRequest, json, type RawResponse } from '../support/http.ts';
import { setSetting } from '../../src/config/settings.ts';

const ACCOUNT_LIMIT = 3;
const WINDOW_MS = 60_000;

describe('sign-in throttling', function () {
  this.timeout(60_000);
  let server: TestServer;
  let account: Account;
  let n = 0;

  before(async () => {
    server = await startTestServer({
      settings: { sign_in_failures_per_account: ACCOUNT_LIMIT, sign_in_failures_per_address: 1000, sign_in_window_ms: WINDOW_MS },
    });
  });
  after(async () => {
    await server?.close();
  });
  beforeEach(async () => {
    await server.pool.query('DELETE FROM sarsen.sign_in_attempts');
    account = await createTenancy(server.pool, `throttle-${++n}`);
  });

  const signIn = (email: string, password: string, opts: { url?: string; tenancy?: string; headers?: Record<string, string> } = {}) =>
    rawRequest(`${opts.url ?? server.url}/${opts.tenancy ?? account.tenancy}/v1/sessions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...opts.headers },
      body: JSON.stringify({ email, password }),
    });
  const wrong = 'not the right password';
  const setting = async (name: string, value: string) => {
    await setSetting(server.pool, name, value);
    await server.settings.refresh();
  };
  const throttled = (res: RawResponse) => {
    expect(res.status, res.body.toString()).to.equal(429);
    expect(json(res).error.code).to.equal('too_many_attempts');
    const seconds = Number(res.headers['retry-after']);
    expect(Number.isInteger(seconds) && seconds >= 1 && seconds <= WINDOW_MS / 1000, `retry-after ${res.headers['retry-after']}`).to.equal(true);
    return seconds;
  };

  it('past the limit an account answers 429 with Retry-After, the right password included, and identically for an email that does not exist', async () => {
    const answers: Record<string, RawResponse> = {};
    for (const email of [account.email, `nobody@${account.tenancy}.test`]) {
      for (let i = 0; i < ACCOUNT_LIMIT; i++) expect((await signIn(email, wrong)).status).to.equal(401);
      answers[email] = await signIn(email, wrong);
      throttled(answers[email]!);
    }
    throttled(await signIn(account.email, account.password));
    const [real, unknown] = Object.values(answers) as [RawResponse, RawResponse];
    expect(unknown.status).to.equal(real.status);
    expect(unknown.headers['content-type']).to.equal(real.headers['content-type']);
    expect(unknown.body.toString()).to.equal(real.body.toString());
    expect(Math.abs(Number(unknown.headers['retry-after']) - Number(real.headers['retry-after']))).to.be.at.most(1);
    // Case and surrounding spaces name the same account, as they do when signing in.
    throttled(await signIn(`  ${account.email.toUpperCase()} `, account.password));
  });

  it('a success starts the account\'s count over', async () => {
    for (let i = 0; i < ACCOUNT_LIMIT - 1; i++) expect((await signIn(account.email, wrong)).status).to.equal(401);
    expect((await signIn(account.email, account.password)).status).to.equal(201);
    for (let i = 0; i < ACCOUNT_LIMIT; i++) expect((await signIn(account.email, wrong)).status).to.equal(401);
    throttled(await signIn(account.email, wrong));
  });

  it('the lock lifts once the window has passed', async () => {
    for (let i = 0; i < ACCOUNT_LIMIT; i++) await signIn(account.email, wrong);
    throttled(await signIn(account.email, account.password));
    // Move the window back instead of waiting it out.
    await server.pool.query(`UPDATE sarsen.sign_in_attempts SET window_start = window_start - make_interval(secs => $1)`, [WINDOW_MS / 1000]);
    expect((await signIn(account.email, wrong)).status).to.equal(401);
    expect((await signIn(account.email, account.password)).status).to.equal(201);
  });

  it('limits one client address across many emails and tenancies; the right password of another account is throttled too', async () => {
    await setting('sign_in_failures_per_address', '5');
    try {
      for (let i = 0; i < 5; i++) expect((await signIn(`guess-${i}@example.com`, wrong)).status).to.equal(401);
      throttled(await signIn('guess-5@example.com', wrong));
      const other = await createTenancy(server.pool, `throttle-other-${n}`);
      throttled(await signIn(other.email, other.password, { tenancy: other.tenancy }));
      // X-Forwarded-For is a caller's to write: without trusted proxies it changes nothing.
      throttled(await signIn('guess-6@example.com', wrong, { headers: { 'x-forwarded-for': '203.0.113.9' } }));
    } finally {
      await setting('sign_in_failures_per_address', '1000');
    }
  });

  it('behind a trusted proxy, counts the address the proxy saw', async () => {
    await setting('sign_in_failures_per_address', '2');
    await setting('trusted_proxy_hops', '1');
    try {
      const from = (address: string) => ({ headers: { 'x-forwarded-for': `198.51.100.1, ${address}` } });
      for (let i = 0; i < 2; i++) expect((await signIn(`a-${i}@example.com`, wrong, from('203.0.113.1'))).status).to.equal(401);
      throttled(await signIn('a-2@example.com', wrong, from('203.0.113.1')));
      // Another client behind the same proxy has its own count; the forged left-hand entry is ignored.
      expect((await signIn('b-0@example.com', wrong, from('203.0.113.2'))).status).to.equal(401);
    } finally {
      await setting('trusted_proxy_hops', '0');
      await setting('sign_in_failures_per_address', '1000');
    }
  });

  it('holds across API processes sharing the database, and under concurrent guesses exactly the limit get through', async () => {
    const second = await startTestServer({ db: server.db, role: 'api', secrets: server.secrets });
    try {
      expect((await signIn(account.email, wrong)).status).to.equal(401);
      expect((await signIn(account.email, wrong, { url: second.url })).status).to.equal(401);
      expect((await signIn(account.email, wrong)).status).to.equal(401);
      throttled(await signIn(account.email, account.password, { url: second.url }));

      const fresh = await createTenancy(server.pool, `throttle-burst-${n}`);
      const burst = await Promise.all(
        Array.from({ length: 20 }, (_, i) => signIn(fresh.email, wrong, { url: i % 2 ? second.url : server.url, tenancy: fresh.tenancy })),
      );
      expect(burst.filter((r) => r.status === 401)).to.have.length(ACCOUNT_LIMIT);
      expect(burst.filter((r) => r.status === 429)).to.have.length(20 - ACCOUNT_LIMIT);
    } finally {
      await second.close();
    }
  });

  it('stores keyed hashes, never the email or the address', async () => {
    await signIn(account.email, wrong);
    const { rows } = await server.pool.query(`SELECT key, attempts FROM sarsen.sign_in_attempts ORDER BY attempts`);
    expect(rows).to.have.length(2); // the account's and the address's
    for (const r of rows) {
      expect(r.key).to.have.length(32);
      expect(r.key.toString('latin1')).to.not.include(account.email);
      expect(r.key.toString('latin1')).to.not.include('127.0.0.1');
    }
  });
});
