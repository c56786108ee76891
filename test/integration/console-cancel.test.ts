// The console's Cancel button (issue 18) in headless Chromium: an admin cancels a pending
// request from its page through the session route; a viewer's page shows no such control.
// Kept apart from console.test.ts, which walks the rest of the console.
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { addUser, type Account } from '../support/control-plane.ts';
import { rawRequest, json } from '../support/http.ts';
import { launchBrowser, screenshot, type TestBrowser } from '../support/browser.ts';

describe('web console: cancelling a request (headless Chromium)', function () {
  this.timeout(120_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let browser: TestBrowser;
  let tenancy: Account;

  before(async () => {
    provider = await startFakeProvider();
    // An api-only process: nothing executes, so a request stays pending.
    server = await startTestServer({ role: 'api' });
    t = await provision(server, provider);
    const tenancyId = (await server.pool.query(`SELECT id FROM sarsen.tenancies WHERE slug = $1`, [t.tenancy])).rows[0].id as string;
    tenancy = { tenancy: t.tenancy, tenancy_id: tenancyId } as Account;
    browser = await launchBrowser();
    browser.page.on('dialog', (d) => void d.accept());
  });
  after(async () => {
    await browser?.close();
    await server?.close();
    await provider?.close();
  });

  const submit = async () => {
    const res = await rawRequest(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: `cancel in the console ${Date.now()}` }] }),
    });
    return json(res).request_id as string;
  };
  const record = async (id: string) => json(await rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key } }));
  const openAs = async (who: Account, id: string) => {
    const page = browser.page;
    await browser.context.clearCookies();
    await page.goto(`${server.url}/console/`);
    await page.getByLabel('Tenancy').fill(who.tenancy);
    await page.getByLabel('Email').fill(who.email);
    await page.getByLabel('Password').fill(who.password);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { level: 1, name: 'Namespaces' }).waitFor();
    await page.goto(`${server.url}/console/#/ns/${t.namespace}/requests/${id}`);
    await page.getByRole('heading', { level: 1, name: `Request ${id}` }).waitFor();
    return page;
  };

  it('an admin cancels a pending request from its page', async () => {
    const admin = await addUser(server.pool, tenancy, `admin@${t.tenancy}.test`, 'admin');
    const id = await submit();
    const page = await openAs(admin, id);
    await page.getByRole('button', { name: 'Cancel request' }).click();
    await page.getByText(`Request ${id} cancelled.`).waitFor();
    // The page is drawn again: the request has ended, so the button is gone.
    await page.getByRole('button', { name: 'Cancel request' }).waitFor({ state: 'detached' });
    await screenshot(page, 'request-cancelled');
    const r = await record(id);
    expect(r.status).to.equal('failed');
    expect(r.error.error.code).to.equal('cancelled');
    expect(provider.journal).to.have.length(0);
  });

  it('a viewer sees no Cancel button', async () => {
    const viewer = await addUser(server.pool, tenancy, `viewer@${t.tenancy}.test`, 'viewer');
    const id = await submit();
    const page = await openAs(viewer, id);
    await page.getByText('Request body').waitFor();
    expect(await page.getByRole('button', { name: 'Cancel request' }).count()).to.equal(0);
    expect((await record(id)).status).to.equal('pending');
  });
});
