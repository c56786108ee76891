// The console knows background responses (issue 42), in headless Chromium: a response found by
// the provider's resp_ id (what a caller of the background routes holds) opens its request's
// page, which says it runs in the background and names each attempt's provider id.
import { expect } from 'chai';
import OpenAI from 'openai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, responsesFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { addUser, type Account } from '../support/control-plane.ts';
import { until } from '../support/http.ts';
import { launchBrowser, screenshot, type TestBrowser, signIn } from '../support/browser.ts';

describe('web console: background responses (headless Chromium)', function () {
  this.timeout(120_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let browser: TestBrowser;
  let viewer: Account;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer();
    t = await provision(server, provider);
    const tenancyId = (await server.pool.query(`SELECT id FROM sarsen.tenancies WHERE slug = $1`, [t.tenancy])).rows[0].id as string;
    viewer = await addUser(server.pool, { tenancy: t.tenancy, tenancy_id: tenancyId } as Account, `viewer@${t.tenancy}.test`, 'viewer');
    browser = await launchBrowser();
    await signIn(browser.page, server.url, viewer);
  });
  after(async () => {
    await browser?.close();
    await server?.close();
    await provider?.close();
  });

  it('finds a response by the provider\'s id; its page says background and names the provider id', async () => {
    provider.enqueue({ kind: 'sse', frames: responsesFrames(['in the ', 'background'], { id: 'resp_console_1' }) });
    const client = new OpenAI({ baseURL: t.base, apiKey: t.key, maxRetries: 0 });
    const stream = await client.responses.create({ model: 'gpt-test', input: 'for the console', background: true, stream: true });
    for await (const _ of stream) { /* read it all */ }
    const done = await until(async () => {
      const r = await client.responses.retrieve('resp_console_1');
      return r.status === 'completed' ? r : undefined;
    });
    expect(done.id).to.equal('resp_console_1');
    const requestId = (await server.pool.query(`SELECT request_id FROM sarsen.provider_response_ids WHERE provider_id = 'resp_console_1'`)).rows[0].request_id as string;

    const page = browser.page;
    await page.goto(`${server.url}/console/#/ns/${t.namespace}/requests`);
    await page.getByLabel('Response id').fill('resp_console_1');
    await page.getByRole('button', { name: 'Find response' }).click();
    await page.getByRole('heading', { level: 1, name: `Request ${requestId}` }).waitFor();
    const facts = page.locator('dl.facts');
    await facts.getByText('resp_console_1').waitFor();
    expect(await facts.textContent()).to.include('Backgroundyes').and.include('resp_console_1 (attempt 1)');
    await screenshot(page, 'background-response');

    // An id the namespace does not know says so.
    await page.goto(`${server.url}/console/#/ns/${t.namespace}/requests`);
    await page.getByLabel('Response id').fill('resp_unknown');
    await page.getByRole('button', { name: 'Find response' }).click();
    await page.getByText('No response resp_unknown').waitFor();
  });
});
