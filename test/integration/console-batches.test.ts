// The console knows batches (issue 43), in headless Chromium: a namespace's Batches page lists a
// batch with a progress bar of its lines, and the batch's page lists its lines, each linking to
// the request it became; the request listing names the batch.
import { expect } from 'chai';
import Anthropic from '@anthropic-ai/sdk';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { addUser, type Account } from '../support/control-plane.ts';
import { until } from '../support/http.ts';
import { launchBrowser, screenshot, type TestBrowser, signIn } from '../support/browser.ts';

describe('web console: batches (headless Chromium)', function () {
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

  it('lists a batch with its progress, its lines with their requests, and the listing names the batch', async () => {
    const client = new Anthropic({ baseURL: t.root, apiKey: t.key, maxRetries: 0 });
    const batch = await client.messages.batches.create({
      requests: [
        { custom_id: 'first', params: { model: 'claude-test', max_tokens: 8, messages: [{ role: 'user', content: 'console one' }] } },
        { custom_id: 'second', params: { model: 'nothing-routes-this', max_tokens: 8, messages: [{ role: 'user', content: 'console two' }] } },
      ],
    });
    await until(async () => ((await client.messages.batches.retrieve(batch.id)).processing_status === 'ended' ? true : undefined));

    const page = browser.page;
    await page.goto(`${server.url}/console/#/ns/${t.namespace}/batches`);
    await page.getByRole('heading', { level: 1, name: `Batches in ${t.namespace}` }).waitFor();
    const bar = page.getByRole('progressbar', { name: '2 of 2 lines ended' });
    await bar.waitFor();
    expect(await page.locator('table').textContent()).to.include(batch.id).and.include('Anthropic message batch').and.include('ended');

    await page.getByRole('link', { name: batch.id }).click();
    await page.getByRole('heading', { level: 1, name: `Batch ${batch.id}` }).waitFor();
    const table = await page.locator('table').textContent();
    expect(table).to.include('first').and.include('succeeded').and.include('second').and.include('refused').and.include('404 not_found');
    await screenshot(page, 'batch');
    const requestId = (await server.pool.query(`SELECT request_id FROM sarsen.batch_lines WHERE batch_id = $1 AND custom_id = 'first'`, [batch.id])).rows[0].request_id as string;
    await page.getByRole('link', { name: requestId }).click();
    await page.getByRole('heading', { level: 1, name: `Request ${requestId}` }).waitFor();

    await page.goto(`${server.url}/console/#/ns/${t.namespace}/requests`);
    await page.getByRole('link', { name: batch.id }).waitFor();
  });
});
