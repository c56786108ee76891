// The console on a namespace of 1,000,000 requests (issue 17's closing note): the seed of
// bench:accounts (60 days of history), then headless Chromium timing the requests listing page
// and a request's page, from navigation until the page shows its content, signed in as the owner.
//
// Run: node bench/console.ts [--rows 1000000] [--samples 10]
// Uses embedded PostgreSQL (or CTX_DATABASE_HOST) like the tests; Chromium at /usr/bin/chromium.
import { startTestServer } from '../test/support/server.ts';
import { startFakeProvider } from '../test/support/fake-provider.ts';
import { shutdownDatabases } from '../test/support/db.ts';
import { addUser } from '../test/support/control-plane.ts';
import { launchBrowser } from '../test/support/browser.ts';
import { provisionAccounts, seedNamespace, settle, type SeedStep } from './lib/accounts-seed.ts';
import { percentile } from './lib/stats.ts';
import { configureLogging } from '../src/log.ts';
import { benchArgs } from './lib/args.ts';

const args = benchArgs({ rows: { type: 'string', default: '1000000' }, samples: { type: 'string', default: '10' } });
const rows = Number(args.rows);
const samples = Number(args.samples);
const log = (s: string) => process.stderr.write(`${s}\n`);
// The in-process server's access log would bury the figures.
configureLogging({ level: 'warn' });

const provider = await startFakeProvider();
const server = await startTestServer();
const browser = await launchBrowser();
try {
  const { main } = await provisionAccounts(server.url, server.pool, provider.url, 4);
  const steps: SeedStep[] = [];
  await seedNamespace(server.pool, main, rows, 60, 100, steps, log);
  await settle(server.pool, steps, log);
  const owner = await addUser(server.pool, { tenancy: main.tenancy, tenancy_id: main.tenancyId, email: '', password: '', user_id: '' }, 'bench@console.test', 'owner');

  const page = browser.page;
  await page.goto(`${server.url}/console/`);
  await page.getByLabel('Tenancy').fill(owner.tenancy);
  await page.getByLabel('Email').fill(owner.email);
  await page.getByLabel('Password').fill(owner.password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { level: 1, name: 'Namespaces' }).waitFor();

  const { rows: [newest] } = await server.pool.query<{ id: string }>('SELECT id FROM sarsen.requests WHERE namespace_id = $1 ORDER BY id DESC LIMIT 1', [main.namespaceId]);
  const measure = async (url: string, ready: () => Promise<void>) => {
    const times: number[] = [];
    for (let i = 0; i < samples + 2; i++) {
      await page.goto('about:blank');
      const t0 = performance.now();
      await page.goto(url);
      await ready();
      if (i >= 2) times.push(performance.now() - t0); // two warm-ups
    }
    return times.sort((a, b) => a - b);
  };
  const listing = await measure(`${server.url}/console/#/ns/main/requests`, () => page.getByRole('row').nth(50).waitFor());
  const request = await measure(`${server.url}/console/#/ns/main/requests/${newest!.id}`, () => page.locator('.facts').getByText('gpt-bench').waitFor());
  for (const [name, t] of [['requests listing page (50 rows)', listing], ['a request\'s page', request]] as const) {
    console.log(`${name}: median ${percentile(t, 50).toFixed(0)} ms, max ${Math.max(...t).toFixed(0)} ms over ${t.length} loads (${rows.toLocaleString()} requests in the namespace)`);
  }
} finally {
  await browser.close();
  await server.close();
  await provider.close();
  await shutdownDatabases();
}
