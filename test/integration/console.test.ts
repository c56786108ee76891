// The web console end to end (issue 17): headless Chromium against a real Sarsen on real
// PostgreSQL, selecting by role and label as a screen reader would. The official openai SDK
// calls through a key made in the UI. Every page is saved as a screenshot under test-output/.
import { expect } from 'chai';
import OpenAI from 'openai';
import type { Page } from 'playwright-core';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatCompletionBody, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { createTenancy, addUser, signInAndChoose, call, type Account } from '../support/control-plane.ts';
import { registerSecret } from '../support/log-guard.ts';
import { launchBrowser, screenshot, type TestBrowser } from '../support/browser.ts';
import { newId } from '../../src/core/ids.ts';
import { handBack } from '../../src/db/recovery.ts';

describe('web console (headless Chromium)', function () {
  this.timeout(120_000);
  let server: TestServer;
  let provider: FakeProvider;
  let owner: Account;
  let owner2: TestBrowser;
  let page: Page;
  let key = '';
  const password = `chosen-in-the-browser-${process.pid}`;
  registerSecret(password);
  const openai = () => new OpenAI({ baseURL: `${server.url}/acme/main/v1`, apiKey: key, maxRetries: 0 });

  const signIn = async (p: Page, a: Pick<Account, 'tenancy' | 'email' | 'password'>, url = server.url) => {
    await p.goto(`${url}/console/`);
    await p.getByLabel('Tenancy').fill(a.tenancy);
    await p.getByLabel('Email').fill(a.email);
    await p.getByLabel('Password').fill(a.password);
    await p.getByRole('button', { name: 'Sign in' }).click();
  };
  const heading = (p: Page, name: string) => p.getByRole('heading', { level: 1, name }).waitFor();
  /** A console page loaded afresh at `hash`, as from a bookmark: nothing kept from pages before. */
  const open = async (hash: string) => {
    await page.goto(`${server.url}/console/${hash}`);
    await page.reload();
  };
  const fact = (name: string) => page.locator('.facts div').filter({ has: page.getByRole('term').filter({ hasText: new RegExp(`^${name}$`) }) }).getByRole('definition');
  const dataRows = () => page.getByRole('row').filter({ has: page.getByRole('cell') });
  /** Waits until the table shows exactly `n` rows (the page re-renders after a change of address). */
  const shows = async (n: number) => {
    await dataRows().nth(n - 1).waitFor();
    await dataRows().nth(n).waitFor({ state: 'detached' });
  };

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer();
    owner = await createTenancy(server.pool, 'acme');
    owner2 = await launchBrowser();
    page = owner2.page;
    page.on('dialog', (d) => void d.accept());
  });
  after(async () => {
    await owner2?.close();
    await server?.close();
    await provider?.close();
  });

  it('serves the console with a CSP without inline script; signs in, forces the password change, keeps the session in an HttpOnly SameSite=Strict cookie', async () => {
    const res = await fetch(`${server.url}/console/`);
    expect(res.status).to.equal(200);
    expect(res.headers.get('content-security-policy')).to.include("script-src 'self'").and.not.include('unsafe-inline');
    expect(await res.text()).not.to.match(/<script>(?!<\/script>)|<script(?![^>]*\bsrc=)[^>]*>/);

    await page.goto(`${server.url}/console/`);
    await heading(page, 'Sign in to Sarsen');
    await screenshot(page, '01-sign-in');
    await signIn(page, { ...owner, password: 'not-the-password' });
    await page.getByText('The email or password is not correct.').waitFor();

    await signIn(page, owner);
    await heading(page, 'Choose your password');
    await screenshot(page, '02-password-change');
    await page.getByLabel('Current password').fill(owner.password);
    await page.getByLabel('New password').fill(password);
    await page.getByRole('button', { name: 'Change password' }).click();
    await heading(page, 'Namespaces');
    owner = { ...owner, password };

    const cookies = await owner2.context.cookies();
    expect(cookies).to.have.length(1);
    expect(cookies[0]).to.include({ name: 'sarsen_session', httpOnly: true, sameSite: 'Strict' });
    expect(await page.evaluate('document.cookie')).to.equal('');
  });

  it('refuses a state-changing request that carries the cookie from another site', async () => {
    const cookie = (await owner2.context.cookies())[0]!;
    const res = await call(server.url, 'POST', '/acme/v1/namespaces', {
      body: { name: 'evil' },
      headers: { cookie: `${cookie.name}=${cookie.value}`, origin: 'http://evil.example', 'sec-fetch-site': 'cross-site' },
    });
    expect(res.status).to.equal(403);
    expect(res.body.error.code).to.equal('forbidden');
  });

  it('creates a namespace, a backend, a rule and a key in the UI; "which rule" answers; the SDK calls through the new key', async () => {
    await page.getByLabel('Name', { exact: true }).fill('main');
    await page.getByLabel('Retention (minutes)').fill('0');
    await page.getByRole('button', { name: 'Create namespace' }).click();
    await page.getByRole('cell', { name: /^0 \(keep as long as the metadata\) → kept / }).waitFor();
    await screenshot(page, '03-namespaces');
    await page.getByRole('link', { name: 'main', exact: true }).click();
    await heading(page, 'Namespace main');

    const credential = `sk-console-${process.pid}`;
    registerSecret(credential);
    await page.getByLabel('Backend name').fill('fake');
    await page.getByLabel('Kind').selectOption('chat_compat');
    await page.getByLabel('Address').fill(`${provider.url}/v1`);
    await page.getByLabel('Credential').fill(credential);
    await page.getByRole('button', { name: 'Save backend' }).click();
    await page.getByText('Backend fake saved.').waitFor();
    await page.getByRole('cell', { name: 'set', exact: true }).waitFor();
    expect(await page.content()).not.to.include(credential);

    await page.getByLabel('Model or pattern').fill('gpt-*');
    await page.getByLabel('Backend', { exact: true }).selectOption({ label: 'fake' });
    await page.getByRole('button', { name: 'Save rule' }).click();
    await page.getByText('Rule gpt-* saved.').waitFor();
    await page.getByRole('row').filter({ hasText: 'gpt-*' }).waitFor(); // the page rendered again

    await page.getByLabel('Which rule takes model').fill('gpt-4o-mini');
    await page.getByRole('button', { name: 'Find rule' }).click();
    await page.getByText('Rule gpt-* takes gpt-4o-mini → backend fake.').waitFor();

    await page.getByLabel('Key name').fill('ci');
    await page.getByRole('checkbox', { name: /manage/ }).check();
    await page.getByRole('button', { name: 'Create key' }).click();
    const shown = page.getByLabel('New API key');
    await shown.waitFor();
    key = (await shown.textContent())!;
    registerSecret(key);
    expect(key).to.match(/^sar_[A-Za-z0-9]{8}_[A-Za-z0-9]{43}$/);
    await page.getByRole('button', { name: 'Copy key' }).waitFor();
    await screenshot(page, '04-namespace');

    provider.enqueue({ kind: 'json', body: chatCompletionBody('hello from the console') });
    const answer = await openai().chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] });
    expect(answer.choices[0]!.message.content).to.equal('hello from the console');
    expect(provider.journal[0]!.headers.authorization).to.equal(`Bearer ${credential}`);
  });

  it('lists the request and shows its stored answer byte for byte in the raw view', async () => {
    // Bytes no re-serialisation would produce: odd spacing and key order.
    const stored = '{ "id":"chatcmpl-raw",  "object":"chat.completion","created":1,"model":"m",\n "choices":[{"index":0,"message":{"role":"assistant","content":"raw ✓"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}';
    provider.enqueue({ kind: 'json', body: stored });
    await openai().chat.completions.create({ model: 'gpt-raw', messages: [{ role: 'user', content: 'raw please' }] });

    await page.getByRole('link', { name: 'Requests' }).first().click();
    await heading(page, 'Requests in main');
    const rows = page.getByRole('row');
    await rows.nth(2).waitFor(); // header + two requests
    expect(await rows.nth(1).textContent()).to.include('gpt-raw'); // newest first
    await screenshot(page, '05-requests');
    await rows.nth(1).getByRole('link').click();
    await page.getByRole('heading', { level: 1, name: /^Request req_/ }).waitFor();
    await page.getByRole('button', { name: 'Raw' }).last().click();
    expect(await page.getByLabel('Answer (raw)').textContent()).to.equal(stored);
    expect(await page.getByLabel('Request body (pretty)').textContent()).to.include('raw please');
    await screenshot(page, '06-request');

    // The session's listing and answer routes share the service routes' handlers and bytes.
    const cookie = (await owner2.context.cookies())[0]!;
    const bySession = await call(server.url, 'GET', '/acme/v1/namespaces/main/requests', { headers: { cookie: `${cookie.name}=${cookie.value}` } });
    const byKey = await call(server.url, 'GET', '/acme/main/v1/requests', { token: key });
    expect(bySession.status).to.equal(200);
    expect(bySession.body).to.deep.equal(byKey.body);
    const id = bySession.body.data[0].request_id;
    const raw = await call(server.url, 'GET', `/acme/v1/namespaces/main/requests/${id}/answer`, { headers: { cookie: `${cookie.name}=${cookie.value}` } });
    expect(raw.text).to.equal(stored);
    expect(raw.headers.get('x-content-type-options')).to.equal('nosniff');
  });

  it('follows a stream live on its page until it ends', async () => {
    const pieces = ['Once ', 'upon ', 'a ', 'time ', 'there ', 'was ', 'a ', 'stream.'];
    provider.reset();
    provider.enqueue({ kind: 'sse', frames: chatFrames(pieces), frameDelayMs: 400 });
    let sdkDone = false;
    const consumed = (async () => {
      const stream = await openai().chat.completions.create({ model: 'gpt-stream', stream: true, messages: [{ role: 'user', content: 'tell me' }] });
      let text = '';
      for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
      sdkDone = true;
      return text;
    })();
    await provider.waitForRequests(1);
    await page.goto(`${server.url}/console/#/ns/main/requests`);
    await page.getByRole('row').nth(1).getByRole('link').click();
    await page.getByRole('heading', { name: 'Stream' }).waitFor();
    await page.locator('.frames li').first().waitFor();
    const liveWhileRunning = !sdkDone && (await page.getByRole('status').filter({ hasText: 'following live' }).count()) === 1;
    expect(await consumed).to.equal(pieces.join(''));
    await page.getByText('stream complete').waitFor();
    expect(liveWhileRunning, 'the page showed frames before the stream ended').to.equal(true);
    expect(await page.getByLabel('Assembled text').textContent()).to.equal(pieces.join(''));
    expect(await page.locator('.frames .seq').first().textContent()).to.match(/^\d+$/);
    await screenshot(page, '07-stream');
  });

  it('shows the deduplication gap on the usage page after identical submissions', async () => {
    provider.reset();
    provider.enqueue({ kind: 'json', body: chatCompletionBody('once'), delayMs: 1500 });
    const body = { model: 'gpt-dedup', messages: [{ role: 'user' as const, content: 'same every time' }] };
    const answers = await Promise.all([1, 2, 3].map(() => openai().chat.completions.create(body)));
    expect(answers.map((a) => a.choices[0]!.message.content)).to.deep.equal(['once', 'once', 'once']);
    expect(provider.journal).to.have.length(1);

    await page.goto(`${server.url}/console/#/ns/main/usage`);
    await heading(page, 'Usage and storage in main');
    // Six accepted submissions so far (one, one, one stream, three identical) and four calls.
    expect(await page.getByLabel('Accepted submissions').locator('.value').textContent()).to.equal('6');
    expect(await page.getByLabel('Provider calls').locator('.value').textContent()).to.equal('4');
    expect(await page.getByLabel('Saved by deduplication').locator('.value').textContent()).to.equal('2');
    const bytes = page.getByRole('figure', { name: 'Bytes by kind' });
    expect(await bytes.getByRole('definition').count()).to.equal(3); // requests, answers, frames
    expect(await bytes.textContent()).to.include('Stream frames').and.not.include('[object');
    const tokens = page.getByRole('figure', { name: 'Tokens per key' });
    expect(await tokens.getByRole('term').allTextContents()).to.deep.equal(['ci']);
    await screenshot(page, '08-usage');
  });

  it('shows a refusal with its status and retry-after, and a swept request as "swept" with what the listing keeps', async () => {
    provider.reset();
    provider.enqueue({ kind: 'refuse', status: 400, retryAfter: '7' });
    const refused = await openai()
      .chat.completions.create({ model: 'gpt-refused', messages: [{ role: 'user', content: 'refuse me' }] })
      .then(() => null, (e: unknown) => e as { status?: number });
    expect(refused?.status).to.equal(400);
    await page.goto(`${server.url}/console/#/ns/main/requests`);
    await page.getByRole('row').nth(1).getByRole('link').click();
    await page.getByText('Refused or failed with status 400; the provider asked to retry after 7.').waitFor();
    await screenshot(page, '08b-refusal');

    const { rows } = await server.pool.query(`UPDATE sarsen.requests SET expired = true WHERE model = 'gpt-raw' RETURNING id`);
    await page.goto(`${server.url}/console/#/ns/main/requests`);
    await page.getByRole('row').filter({ hasText: 'gpt-raw' }).getByText('swept').waitFor();
    await page.getByRole('link', { name: rows[0].id }).click();
    await page.getByText(/^Swept: retention removed/).waitFor();
    expect(await page.locator('.facts').textContent()).to.include('gpt-raw');
  });

  it('filters the listing by status, model, key and creation time; the filters live in the address', async () => {
    await open('#/ns/main/requests');
    await heading(page, 'Requests in main');
    const all = await dataRows().count();
    expect(all).to.be.greaterThan(3);

    await page.getByLabel('Status').selectOption('failed');
    await page.getByRole('button', { name: 'Apply filters' }).click();
    await page.waitForURL(/#\/ns\/main\/requests\?status=failed$/);
    await shows(1);
    expect(await dataRows().textContent()).to.include('gpt-refused');
    await screenshot(page, '05b-requests-filtered');
    await page.reload(); // a filtered listing is a link: the form shows what it filters
    await shows(1);
    expect(await page.getByLabel('Status').inputValue()).to.equal('failed');

    await page.getByRole('button', { name: 'Clear filters' }).click();
    await page.waitForURL(/#\/ns\/main\/requests$/);
    await shows(all);
    await page.getByLabel('Model').fill('gpt-dedup');
    await page.getByRole('button', { name: 'Apply filters' }).click();
    await page.waitForURL(/model=gpt-dedup/);
    await shows(1); // three identical submissions, one request
    expect(await dataRows().textContent()).to.include('gpt-dedup');

    await page.getByLabel('Model').fill('');
    await page.getByLabel('Key').selectOption({ index: 1 });
    expect(await page.getByLabel('Key').locator('option:checked').textContent()).to.match(/^ci \(/);
    await page.getByRole('button', { name: 'Apply filters' }).click();
    await page.waitForURL(/api_key_id=key_/);
    await shows(all); // every request so far came through ci

    await page.getByLabel('Created before').fill('2020-01-01T00:00');
    await page.getByRole('button', { name: 'Apply filters' }).click();
    await page.getByText('No requests match these filters.').waitFor();
    expect(decodeURIComponent(page.url())).to.include('created_before=2020-01-01T');
    await page.getByLabel('Created before').fill('');
    await page.getByLabel('Created from').fill('2020-01-01T00:00');
    await page.getByRole('button', { name: 'Apply filters' }).click();
    await shows(all);
  });

  it('a request opened by direct link, far down the listing, shows its timings, tokens and cost; so does a swept one', async () => {
    const { rows: [first] } = await server.pool.query(`SELECT id, prompt_tokens, completion_tokens FROM sarsen.requests WHERE model = 'gpt-4o-mini'`);
    // Sixty newer requests push it off the listing's first page.
    await server.pool.query(
      `INSERT INTO sarsen.requests (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model, status)
       SELECT s.id, q.tenancy_id, q.namespace_id, q.api_key_id, q.backend_id, 'chat', false, 'gpt-seeded', 'gpt-seeded', 'succeeded'
         FROM unnest($1::text[]) AS s(id), sarsen.requests q WHERE q.id = $2`,
      [Array.from({ length: 60 }, () => newId('req')), first.id],
    );
    await open(`#/ns/main/requests/${first.id}`);
    await page.getByRole('heading', { level: 1, name: `Request ${first.id}` }).waitFor();
    expect(await fact('Model').textContent()).to.equal('gpt-4o-mini');
    expect(await fact('Tokens').textContent()).to.equal(`${first.prompt_tokens} in · ${first.completion_tokens} out`);
    expect(await fact('Took').textContent()).to.match(/^[\d,]+ ms$/);
    expect(await fact('Waited').textContent()).to.match(/^[\d,]+ ms$/);
    expect(await fact('Cost').textContent()).to.match(/^\d+\.\d{6} credits$/);
    await screenshot(page, '06b-request-direct');

    const { rows: [swept] } = await server.pool.query(`SELECT id FROM sarsen.requests WHERE model = 'gpt-raw'`);
    await open(`#/ns/main/requests/${swept.id}`);
    await page.getByText(/^Swept: retention removed/).waitFor();
    expect(await fact('Model').textContent()).to.equal('gpt-raw');
    expect(await fact('Tokens').textContent()).to.equal('3 in · 2 out');
  });

  it('follows a stream whose first attempt is superseded: the discarded frames marked, the new attempt followed to its end', async () => {
    provider.reset();
    let calls = 0;
    const second = ['The ', 'second ', 'attempt ', 'answers.'];
    provider.rule((entry) => {
      if (entry.path !== '/v1/chat/completions') return undefined;
      return ++calls === 1
        ? { kind: 'sse', frames: chatFrames(Array.from({ length: 25 }, (_, i) => `first${i} `)), frameDelayMs: 200 }
        : { kind: 'sse', frames: chatFrames(second), frameDelayMs: 100 };
    });
    const submitted = await call(server.url, 'POST', '/acme/main/v1/requests', {
      headers: { 'x-sarsen-key': key },
      body: { model: 'gpt-superseded', stream: true, messages: [{ role: 'user', content: 'twice' }] },
    });
    expect(submitted.status).to.equal(202);
    const id = submitted.body.request_id as string;
    await open(`#/ns/main/requests/${id}`);
    await page.getByRole('heading', { name: 'Stream' }).waitFor();
    await page.locator('.frames li').nth(2).waitFor();
    // The attempt handed back as a shutting-down executor hands it back: readers are told
    // `superseded` and another attempt starts.
    expect(await handBack(server.pool, id, 1, 'console-test')).to.equal(true);
    await page.getByText(/attempt superseded: the frames above were discarded/).waitFor();
    await page.getByText('stream complete').waitFor({ timeout: 30_000 });
    expect(await page.getByLabel('Assembled text').textContent()).to.equal(second.join(''));
    const discarded = await page.locator('.frames li.superseded').count();
    expect(discarded).to.be.greaterThan(3); // the first attempt's frames and the notice
    expect(await page.locator('.frames li:not(.superseded)').count()).to.be.greaterThan(second.length);
    await fact('Attempts').filter({ hasText: /^2$/ }).waitFor(); // read again when the stream ended
    await screenshot(page, '07b-stream-superseded');
    provider.reset();
  });

  it('revokes the key in the UI, after which the SDK gets 401', async () => {
    await page.goto(`${server.url}/console/#/ns/main`);
    await page.getByRole('button', { name: 'Revoke key ci' }).click();
    await page.getByText('Key ci revoked.').waitFor();
    const err = await openai()
      .chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'after revocation' }] })
      .then(() => null, (e: unknown) => e as { status?: number });
    expect(err?.status).to.equal(401);
  });

  it('edits a backend and a routing rule in the UI; the credential is kept when left empty; Clear starts a new one', async () => {
    await open('#/ns/main');
    await heading(page, 'Namespace main');
    await page.getByRole('button', { name: 'Edit backend fake' }).click();
    expect(await page.getByLabel('Backend name').inputValue()).to.equal('fake');
    expect(await page.getByLabel('Credential').inputValue()).to.equal('');
    await page.getByLabel('Address').fill(`${provider.url}/v2`);
    await page.getByRole('button', { name: 'Save backend' }).click();
    await page.getByText('Backend fake saved.').waitFor();
    await page.getByRole('cell', { name: `${provider.url}/v2` }).waitFor();
    const cookie = (await owner2.context.cookies())[0]!;
    const session = { headers: { cookie: `${cookie.name}=${cookie.value}` } };
    const backends = (await call(server.url, 'GET', '/acme/v1/namespaces/main/backends', session)).body.data;
    expect(backends).to.have.length(1);
    expect(backends[0]).to.include({ name: 'fake', address: `${provider.url}/v2`, has_credential: true });

    // After an edit, Clear empties the form: saving then creates, never changes the edited one.
    await page.getByRole('button', { name: 'Edit backend fake' }).click();
    await page.getByRole('button', { name: 'Clear' }).first().click();
    await page.getByLabel('Backend name').fill('spare');
    await page.getByLabel('Address').fill(`${provider.url}/v1`);
    await page.getByRole('button', { name: 'Save backend' }).click();
    await page.getByText('Backend spare saved.').waitFor();
    const backendNames = page.getByRole('region', { name: 'Backends' }).locator('tbody td:first-child');
    await page.getByRole('region', { name: 'Backends' }).getByRole('cell', { name: 'spare', exact: true }).waitFor();
    expect(await backendNames.allTextContents()).to.deep.equal(['fake', 'spare']);

    await page.getByRole('button', { name: 'Edit rule gpt-*' }).click();
    expect(await page.getByLabel('Model or pattern').inputValue()).to.equal('gpt-*');
    await page.getByLabel('Rewrite model to').fill('gpt-rewritten');
    await page.getByLabel('Priority').fill('5');
    await page.getByLabel('Backend', { exact: true }).selectOption({ label: 'spare' });
    await page.getByRole('button', { name: 'Save rule' }).click();
    await page.getByText('Rule gpt-* saved.').waitFor();
    const rule = page.getByRole('row').filter({ hasText: 'gpt-*' });
    await rule.getByRole('cell', { name: 'gpt-rewritten' }).waitFor();
    expect(await rule.getByRole('cell').allTextContents()).to.include.members(['spare', '5']);
    const rules = (await call(server.url, 'GET', '/acme/v1/namespaces/main/routing-rules', session)).body.data;
    expect(rules).to.have.length(1);
    expect(rules[0]).to.include({ model: 'gpt-*', rewrite_model: 'gpt-rewritten', priority: 5 });
    await page.getByLabel('Which rule takes model').fill('gpt-x');
    await page.getByRole('button', { name: 'Find rule' }).click();
    await page.getByText('Rule gpt-* takes gpt-x → backend spare, as model gpt-rewritten.').waitFor();
    await screenshot(page, '04b-namespace-edited');
  });

  it('owner pages: users (generated password shown once, role change) and billing', async () => {
    await page.getByRole('link', { name: 'Users' }).click();
    await heading(page, 'Users');
    await page.getByLabel('Email').fill('new@acme.test');
    await page.getByLabel('Role', { exact: true }).selectOption('admin');
    await page.getByRole('button', { name: 'Add user' }).click();
    const generated = page.getByLabel('Generated password');
    await generated.waitFor();
    registerSecret((await generated.textContent())!);
    await page.getByLabel('Role of new@acme.test').selectOption('viewer');
    await page.getByText('new@acme.test is now viewer.').waitFor();
    await screenshot(page, '09-users');
    const { rows } = await server.pool.query(`SELECT role FROM sarsen.users WHERE email = 'new@acme.test'`);
    expect(rows[0].role).to.equal('viewer');

    await page.getByRole('link', { name: 'Billing' }).click();
    await heading(page, 'Billing');
    await page.getByText('Balance').waitFor();
    await screenshot(page, '10-billing');
  });

  it('pages through the ledger on the billing page, newest first, none skipped or repeated', async () => {
    const { rows: [ns] } = await server.pool.query(`SELECT id FROM sarsen.namespaces WHERE tenancy_id = $1 AND name = 'main'`, [owner.tenancy_id]);
    await server.pool.query(
      `INSERT INTO sarsen.ledger (tenancy_id, namespace_id, request_id, kind, amount_micros)
       SELECT $1, $2, 'req_' || lpad(g::text, 26, '0'), 'tokens', g FROM generate_series(1, 120) g`,
      [owner.tenancy_id, ns.id],
    );
    const { rows } = await server.pool.query(`SELECT request_id FROM sarsen.ledger WHERE tenancy_id = $1 ORDER BY id DESC`, [owner.tenancy_id]);
    await open('#/billing');
    await heading(page, 'Billing');
    const older = page.getByRole('button', { name: 'Older entries' });
    for (const shown of [50, 100]) {
      await shows(shown);
      await older.click();
    }
    await shows(rows.length);
    expect(await older.isHidden()).to.equal(true);
    expect(await dataRows().locator('code').allTextContents()).to.deep.equal(rows.map((r) => r.request_id));
  });

  it('a viewer sees the namespace but no control that changes it, and the server refuses a write', async () => {
    const viewer = await addUser(server.pool, owner, 'viewer@acme.test', 'viewer');
    const b = await launchBrowser();
    try {
      await signIn(b.page, viewer);
      await heading(b.page, 'Namespaces');
      await b.page.getByRole('link', { name: 'main', exact: true }).click();
      await heading(b.page, 'Namespace main');
      await b.page.getByRole('cell', { name: 'fake', exact: true }).first().waitFor();
      for (const name of ['Save backend', 'Save rule', 'Create key', 'Edit backend fake', 'Delete backend fake']) {
        expect(await b.page.getByRole('button', { name }).count(), name).to.equal(0);
      }
      const status = await b.page.evaluate(async () =>
        (await fetch('/acme/v1/namespaces', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"name":"nope"}' })).status,
      );
      expect(status).to.equal(403);
      await screenshot(b.page, '11-viewer');
    } finally {
      await b.close();
    }
  });

  it("another tenancy's session sees nothing of this one", async () => {
    const other = (await signInAndChoose(server.url, await createTenancy(server.pool, 'globex'))).account;
    const b = await launchBrowser();
    try {
      await signIn(b.page, other);
      await heading(b.page, 'Namespaces');
      await b.page.getByText('No namespaces yet').waitFor();
      const statuses = await b.page.evaluate(async () =>
        Promise.all(['/acme/v1/namespaces', '/acme/v1/namespaces/main/requests', '/acme/v1/sessions/current'].map(async (p) => (await fetch(p)).status)),
      );
      expect(statuses).to.deep.equal([401, 401, 401]);
    } finally {
      await b.close();
    }
  });

  it('shows the server\'s refusal of a backend on a private host (backends_public_only on)', async () => {
    const strict = await startTestServer({ settings: { backends_public_only: true } });
    const b = await launchBrowser();
    try {
      const { token, account } = await signInAndChoose(strict.url, await createTenancy(strict.pool, 'initech'));
      expect((await call(strict.url, 'POST', '/initech/v1/namespaces', { token, body: { name: 'main' } })).status).to.equal(201);
      await signIn(b.page, account, strict.url);
      await heading(b.page, 'Namespaces');
      await b.page.getByRole('link', { name: 'main', exact: true }).click();
      await b.page.getByLabel('Backend name').fill('local');
      await b.page.getByLabel('Address').fill('http://127.0.0.1:9/v1');
      await b.page.getByRole('button', { name: 'Save backend' }).click();
      await b.page.getByText(/^The backend host 127.0.0.1 is a loopback address; this deployment reaches only public addresses.$/).waitFor();
      expect(await b.page.getByText('No backends yet.').count()).to.equal(1);
    } finally {
      await b.close();
      await strict.close();
    }
  });

  it('signs out, and an expired session sends the browser back to sign in', async () => {
    await page.getByRole('button', { name: 'Sign out' }).click();
    await heading(page, 'Sign in to Sarsen');
    expect(await owner2.context.cookies()).to.deep.equal([]);

    await signIn(page, owner);
    await heading(page, 'Namespaces');
    await server.pool.query(`DELETE FROM sarsen.sessions`);
    await page.getByRole('link', { name: 'main', exact: true }).click();
    await heading(page, 'Sign in to Sarsen');
    await page.getByText('Your session has ended. Sign in again.').waitFor();
  });
});
