// Rate limits and the response cache in the console (issue 32), in headless Chromium: an admin
// sets a key's limits when issuing it and changes them in place, turns the namespace's cache on,
// and sees a cached request marked in the listing, on its page and on the usage page. Kept apart
// from console.test.ts, which walks the rest of the console.
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { addUser, call, type Account } from '../support/control-plane.ts';
import { rawRequest } from '../support/http.ts';
import { registerSecret } from '../support/log-guard.ts';
import { launchBrowser, screenshot, type TestBrowser } from '../support/browser.ts';

describe('web console: rate limits and the response cache (headless Chromium)', function () {
  this.timeout(120_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let browser: TestBrowser;
  let admin: Account;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer();
    t = await provision(server, provider);
    const tenancyId = (await server.pool.query(`SELECT id FROM sarsen.tenancies WHERE slug = $1`, [t.tenancy])).rows[0].id as string;
    admin = await addUser(server.pool, { tenancy: t.tenancy, tenancy_id: tenancyId } as Account, `admin@${t.tenancy}.test`, 'admin');
    browser = await launchBrowser();
    const page = browser.page;
    await page.goto(`${server.url}/console/`);
    await page.getByLabel('Tenancy').fill(admin.tenancy);
    await page.getByLabel('Email').fill(admin.email);
    await page.getByLabel('Password').fill(admin.password);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { level: 1, name: 'Namespaces' }).waitFor();
  });
  after(async () => {
    await browser?.close();
    await server?.close();
    await provider?.close();
  });

  const keys = async () => (await call(server.url, 'GET', `/${t.tenancy}/v1/namespaces/${t.namespace}/api-keys`, { token: t.adminToken })).body.data as { name: string; limits: object }[];
  const openNamespace = async () => {
    await browser.page.goto(`${server.url}/console/#/ns/${t.namespace}`);
    await browser.page.getByRole('heading', { level: 1, name: `Namespace ${t.namespace}` }).waitFor();
  };

  it('issues a key with limits and changes them in place', async () => {
    const page = browser.page;
    await openNamespace();
    const create = page.getByRole('form', { name: 'Create API key' });
    await create.getByLabel('Key name').fill('paced');
    await create.getByLabel('Requests per minute').fill('2');
    await create.getByRole('button', { name: 'Create key' }).click();
    const shown = page.getByLabel('New API key');
    await shown.waitFor();
    registerSecret((await shown.textContent())!);
    await page.getByRole('cell', { name: '2 requests/min' }).waitFor();
    expect((await keys()).find((k) => k.name === 'paced')!.limits).to.deep.equal({ requests_per_minute: 2, tokens_per_minute: null });

    const change = page.getByRole('form', { name: "Change a key's limits" });
    const paced = await change.getByLabel('Key').locator('option', { hasText: 'paced' }).getAttribute('value');
    await change.getByLabel('Key').selectOption(paced!);
    await change.getByLabel('Tokens per minute').fill('5000');
    await change.getByRole('button', { name: 'Save limits' }).click();
    await page.getByText('Limits of key paced: 5,000 tokens/min.').waitFor();
    expect((await keys()).find((k) => k.name === 'paced')!.limits).to.deep.equal({ requests_per_minute: null, tokens_per_minute: 5000 });
    await screenshot(page, 'key-limits');
  });

  it('turns the response cache on; a cached request is marked in the listing, on its page and in usage', async () => {
    const page = browser.page;
    await openNamespace();
    const cache = page.getByRole('form', { name: 'Response cache' });
    await cache.getByLabel('Serve cached answers for (minutes)').fill('10');
    await cache.getByRole('button', { name: 'Save cache' }).click();
    await page.getByText('Answers are served from the cache for 10 minutes.').waitFor();
    expect((await call(server.url, 'GET', `/${t.tenancy}/v1/namespaces/${t.namespace}`, { token: t.adminToken })).body.cache_ttl_minutes).to.equal(10);

    const send = () =>
      rawRequest(`${t.base}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
        body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: 'asked twice' }] }),
      });
    expect((await send()).status).to.equal(200);
    const second = await send();
    const from = second.headers['x-sarsen-cached-from'] as string;
    expect(from).to.match(/^req_/);

    await page.goto(`${server.url}/console/#/ns/${t.namespace}/requests`);
    const row = page.getByRole('row').filter({ has: page.locator('.pill.cached') });
    await row.waitFor();
    expect(await row.count()).to.equal(1);
    const copy = (await row.getByRole('link').textContent())!;
    expect(copy).to.not.equal(from);
    await row.getByRole('link').click();
    await page.getByRole('heading', { level: 1, name: `Request ${copy}` }).waitFor();
    const cachedFrom = page.locator('.facts div').filter({ has: page.getByRole('term').filter({ hasText: /^Cached from$/ }) }).getByRole('definition');
    expect(await cachedFrom.getByRole('link').textContent()).to.equal(from);
    await screenshot(page, 'cached-request');

    await page.goto(`${server.url}/console/#/ns/${t.namespace}/usage`);
    await page.getByLabel('Answered from the cache').waitFor();
    expect(await page.getByLabel('Answered from the cache').locator('.value').textContent()).to.equal('1');
    await page.getByRole('cell', { name: 'paced' }).waitFor();
  });
});
