// The console knows the responses dialect (issue 31), in headless Chromium: the listing filters
// by dialect (the filter lands in the page's address), and a Responses stream's page shows its
// named events as frames and assembles their text.
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, responsesFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { addUser, type Account } from '../support/control-plane.ts';
import { rawRequest, json, until } from '../support/http.ts';
import { launchBrowser, screenshot, type TestBrowser, signIn } from '../support/browser.ts';

describe('web console: the responses dialect (headless Chromium)', function () {
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

  const submit = async (dialect: string, body: object) => {
    const res = await rawRequest(`${t.base}/requests?dialect=${dialect}`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key }, body: JSON.stringify(body) });
    const id = json(res).request_id as string;
    await until(async () => (json(await rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key } })).status === 'succeeded' ? true : undefined));
    return id;
  };

  it('filters the listing by dialect, and a Responses stream\'s page assembles its text from the named events', async () => {
    const chatId = await submit('chat', { model: 'gpt-test', messages: [{ role: 'user', content: 'a chat' }] });
    const pieces = ['Respon', 'ses ', 'in the ', 'console'];
    const frames = responsesFrames(pieces, { inputTokens: 9, outputTokens: 4 });
    provider.enqueue({ kind: 'sse', frames });
    const responsesId = await submit('responses', { model: 'gpt-test', stream: true, input: 'a response' });

    const page = browser.page;
    await page.goto(`${server.url}/console/#/ns/${t.namespace}/requests`);
    await page.getByLabel('Dialect').selectOption('responses');
    await page.getByRole('button', { name: 'Apply filters' }).click();
    await page.waitForURL(/dialect=responses/);
    // The filtered listing replaces the whole one: the chat request goes, the responses one stays.
    await page.getByText(chatId).waitFor({ state: 'detached' });
    const rows = page.getByRole('row');
    expect(await rows.count()).to.equal(2); // the header and the one responses request
    expect(await rows.nth(1).textContent()).to.include(responsesId).and.include('responses · stream');
    await screenshot(page, 'responses-listing');

    await rows.nth(1).getByRole('link').click();
    await page.getByRole('heading', { level: 1, name: `Request ${responsesId}` }).waitFor();
    await page.getByText('stream complete').waitFor();
    expect(await page.getByLabel('Assembled text').textContent()).to.equal(pieces.join(''));
    expect(await page.locator('.frames li').count()).to.equal(frames.length);
    expect(await page.locator('.frames code').first().textContent()).to.include('"type":"response.created"');
    await screenshot(page, 'responses-stream');
  });
});
