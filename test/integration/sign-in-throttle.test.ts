// Sign-in throttling (issues 14, 29): attempts counted per account and client address together,
// per address, and per account as a ceiling, in PostgreSQL, so every API process sharing the
// database enforces the same limits; 429 with Retry-After, the same whether or not the email
// exists. Distinct client addresses are real source addresses on the loopback network
// (127.0.0.x), not headers.
import { expect } from 'chai';
import http from 'node:http';
import { startTestServer, type TestServer } from '../support/server.ts';
import { createTenancy, type Account } from '../support/control-plane.ts';
import { rawRequest, json, type RawResponse } from '../support/http.ts';
import { setSetting } from '../../src/config/settings.ts';
import { throttleKeys } from '../../src/core/sign-in-throttle.ts';

const PAIR_LIMIT = 3;
const WINDOW_MS = 60_000;

describe('sign-in throttling', function () {
  this.timeout(60_000);
  let server: TestServer;
  let account: Account;
  let n = 0;

  before(async () => {
    server = await startTestServer({
      settings: { sign_in_failures_per_account_address: PAIR_LIMIT, sign_in_failures_per_account: 1000, sign_in_failures_per_address: 1000, sign_in_window_ms: WINDOW_MS },
    });
  });
  after(async () => {
    await server?.close();
  });
  beforeEach(async () => {
    await server.pool.query('DELETE FROM sarsen.sign_in_attempts');
    account = await createTenancy(server.pool, `throttle-${++n}`);
  });

  const signIn = (email: string, password: string, opts: { url?: string; tenancy?: string; headers?: Record<string, string>; from?: string } = {}) =>
    opts.from === undefined
      ? rawRequest(`${opts.url ?? server.url}/${opts.tenancy ?? account.tenancy}/v1/sessions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...opts.headers },
          body: JSON.stringify({ email, password }),
        })
      : fromAddress(opts.from, `${opts.url ?? server.url}/${opts.tenancy ?? account.tenancy}/v1/sessions`, JSON.stringify({ email, password }));
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

  it('past the limit an address answers 429 with Retry-After for that account, the right password included, and identically for an email that does not exist', async () => {
    const answers: Record<string, RawResponse> = {};
    for (const email of [account.email, `nobody@${account.tenancy}.test`]) {
      for (let i = 0; i < PAIR_LIMIT; i++) expect((await signIn(email, wrong)).status).to.equal(401);
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

  it('a success starts its address\'s count for the account over', async () => {
    for (let i = 0; i < PAIR_LIMIT - 1; i++) expect((await signIn(account.email, wrong)).status).to.equal(401);
    expect((await signIn(account.email, account.password)).status).to.equal(201);
    for (let i = 0; i < PAIR_LIMIT; i++) expect((await signIn(account.email, wrong)).status).to.equal(401);
    throttled(await signIn(account.email, wrong));
  });

  it('the lock lifts once the window has passed', async () => {
    for (let i = 0; i < PAIR_LIMIT; i++) await signIn(account.email, wrong);
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
      expect(burst.filter((r) => r.status === 401)).to.have.length(PAIR_LIMIT);
      expect(burst.filter((r) => r.status === 429)).to.have.length(20 - PAIR_LIMIT);
    } finally {
      await second.close();
    }
  });

  it('an attacker\'s address is throttled on the owner\'s account while the owner, signing in from another address, gets in', async () => {
    const attacker = '127.0.0.2';
    const owner = '127.0.0.3';
    for (let i = 0; i < PAIR_LIMIT; i++) expect((await signIn(account.email, wrong, { from: attacker })).status).to.equal(401);
    // The attacker goes on guessing, and is refused before any password is checked, even the right one.
    for (let i = 0; i < 20; i++) throttled(await signIn(account.email, wrong, { from: attacker }));
    throttled(await signIn(account.email, account.password, { from: attacker }));
    // The owner, elsewhere, mistypes once, then gets in.
    expect((await signIn(account.email, wrong, { from: owner })).status).to.equal(401);
    expect((await signIn(account.email, account.password, { from: owner })).status).to.equal(201);
  });

  it('attempts refused while throttled do not count toward the account\'s ceiling: one address hammering it cannot lock out the owner, who mistypes once elsewhere and gets in', async () => {
    // The attacker's counted guesses (PAIR_LIMIT) plus the owner's two fit under the ceiling;
    // the attacker's refused ones would overshoot it many times.
    const ceiling = PAIR_LIMIT + 2;
    const perAddress = PAIR_LIMIT + 2;
    await setting('sign_in_failures_per_account', String(ceiling));
    await setting('sign_in_failures_per_address', String(perAddress));
    try {
      const accountCount = async (email: string) => {
        const { account: key } = throttleKeys(server.secrets.apiKeyHashKey, { tenancy: account.tenancy, email, address: '127.0.0.1' });
        const { rows } = await server.pool.query<{ attempts: number }>(`SELECT attempts FROM sarsen.sign_in_attempts WHERE key = $1`, [key]);
        return rows[0]?.attempts;
      };
      const nobody = `nobody@${account.tenancy}.test`;
      const answers: Record<string, number[]> = {};
      for (const [email, attacker, owner] of [[account.email, '127.0.3.1', '127.0.3.2'], [nobody, '127.0.4.1', '127.0.4.2']] as const) {
        const seen: number[] = (answers[email] = []);
        for (let i = 0; i < PAIR_LIMIT; i++) seen.push((await signIn(email, wrong, { from: attacker })).status);
        // Far past the address's own limit, every one refused before any password is checked.
        for (const password of [...Array<string>(10 * perAddress).fill(wrong), account.password]) {
          const res = await signIn(email, password, { from: attacker });
          throttled(res);
          seen.push(res.status);
        }
        expect(await accountCount(email)).to.equal(PAIR_LIMIT);
        // Its refused attempts still count against the address: it stays throttled on other accounts too.
        throttled(await signIn(`elsewhere-${email}`, wrong, { from: attacker }));
        // The owner, from an address with no failures, mistypes once, then signs in.
        seen.push((await signIn(email, wrong, { from: owner })).status);
        seen.push((await signIn(email, account.password, { from: owner })).status);
      }
      const known = answers[account.email]!;
      const unknown = answers[nobody]!;
      expect(known.slice(0, PAIR_LIMIT)).to.deep.equal(Array(PAIR_LIMIT).fill(401));
      expect(known.slice(-2)).to.deep.equal([401, 201]);
      // An email that does not exist is answered alike throughout; its "right password" is wrong.
      expect(unknown.slice(0, -1)).to.deep.equal(known.slice(0, -1));
      expect(unknown.at(-1)).to.equal(401);
    } finally {
      await setting('sign_in_failures_per_account', '1000');
      await setting('sign_in_failures_per_address', '1000');
    }
  });

  it('past the account\'s ceiling, addresses that already tried the account wait; one that never did is still heard', async () => {
    await setting('sign_in_failures_per_account', '6');
    try {
      // Three addresses, two failures each: every one below its own limit, the account at its ceiling.
      const guessers = ['127.0.0.4', '127.0.0.5', '127.0.0.6'];
      for (const from of guessers) for (let i = 0; i < 2; i++) expect((await signIn(account.email, wrong, { from })).status).to.equal(401);
      for (const from of guessers) throttled(await signIn(account.email, account.password, { from }));
      // An address with no attempt on this account in the window: its password is checked.
      expect((await signIn(account.email, wrong, { from: '127.0.0.7' })).status).to.equal(401);
      throttled(await signIn(account.email, wrong, { from: '127.0.0.7' }));
      expect((await signIn(account.email, account.password, { from: '127.0.0.8' })).status).to.equal(201);
      // The same for an email that does not exist.
      const nobody = `nobody@${account.tenancy}.test`;
      for (const from of guessers) for (let i = 0; i < 2; i++) expect((await signIn(nobody, wrong, { from })).status).to.equal(401);
      throttled(await signIn(nobody, wrong, { from: guessers[0] }));
      expect((await signIn(nobody, wrong, { from: '127.0.0.8' })).status).to.equal(401);
    } finally {
      await setting('sign_in_failures_per_account', '1000');
    }
  });

  it('answers a known and an unknown email with the same bodies and in the same time class, checked or throttled', async () => {
    const nobody = `nobody@${account.tenancy}.test`;
    const timed = async (email: string, from: string) => {
      const started = process.hrtime.bigint();
      const res = await signIn(email, wrong, { from });
      return { res, ms: Number(process.hrtime.bigint() - started) / 1e6 };
    };
    const rounds = { known: { checked: [] as number[], throttled: [] as number[] }, unknown: { checked: [] as number[], throttled: [] as number[] } };
    const bodies = new Set<string>();
    // Interleaved, so the machine's load falls on both alike; four addresses each, for more samples.
    for (let n = 0; n < 4; n++) {
      for (let i = 0; i < PAIR_LIMIT + 3; i++) {
        for (const [which, email, from] of [['known', account.email, `127.0.1.${n}`], ['unknown', nobody, `127.0.2.${n}`]] as const) {
          const { res, ms } = await timed(email, from);
          const kind = i < PAIR_LIMIT ? 'checked' : 'throttled';
          expect(res.status).to.equal(kind === 'checked' ? 401 : 429);
          rounds[which][kind].push(ms);
          bodies.add(`${res.status} ${res.headers['content-type']} ${res.body.toString()}`);
        }
      }
    }
    expect([...bodies]).to.have.length(2); // one 401 body and one 429 body, whichever the email
    const median = (v: number[]) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!;
    const m = { kc: median(rounds.known.checked), uc: median(rounds.unknown.checked), kt: median(rounds.known.throttled), ut: median(rounds.unknown.throttled) };
    process.stderr.write(`      (median ms: known checked ${m.kc.toFixed(1)}, unknown checked ${m.uc.toFixed(1)}, known throttled ${m.kt.toFixed(1)}, unknown throttled ${m.ut.toFixed(1)})\n`);
    // A password check (scrypt) for both or for neither: the two classes of each answer are alike,
    // and the throttled answers, which check nothing, are quicker than the checked ones.
    expect(m.kc / m.uc).to.be.within(0.5, 2);
    expect(Math.max(m.kt, m.ut)).to.be.below(Math.min(m.kc, m.uc));
  });

  it('stores keyed hashes, never the email or the address', async () => {
    await signIn(account.email, wrong);
    const { rows } = await server.pool.query(`SELECT key, attempts FROM sarsen.sign_in_attempts ORDER BY attempts`);
    expect(rows).to.have.length(3); // the account and address's together, the account's, the address's
    for (const r of rows) {
      expect(r.key).to.have.length(32);
      expect(r.key.toString('latin1')).to.not.include(account.email);
      expect(r.key.toString('latin1')).to.not.include('127.0.0.1');
    }
  });
});

/** POSTs `body` from the local address `from` (a loopback address other than 127.0.0.1 is another client). */
function fromAddress(from: string, url: string, body: string): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: 'POST', localAddress: from, agent: false, headers: { 'content-type': 'application/json' } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}
