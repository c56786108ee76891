// Headless Chromium (Debian's package) driven by playwright-core, for the console's tests.
// A fresh profile per launch; screenshots go under the run's output folder.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { track } from './resources.ts';

export const CHROMIUM = process.env.SARSEN_CHROMIUM ?? '/usr/bin/chromium';
export const OUTPUT_DIR = path.resolve(process.env.SARSEN_TEST_OUTPUT ?? 'test-output', 'console');

export type TestBrowser = { context: BrowserContext; page: Page; close(): Promise<void> };

/** One Chromium with a fresh --user-data-dir (playwright passes it for a persistent context). */
export async function launchBrowser(): Promise<TestBrowser> {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1280, height: 800 },
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  const release = track('browser', CHROMIUM);
  return {
    context,
    page: context.pages()[0] ?? (await context.newPage()),
    async close() {
      await context.close();
      fs.rmSync(profile, { recursive: true, force: true });
      release();
    },
  };
}

/** A full-page screenshot named after the page, under OUTPUT_DIR. */
export async function screenshot(page: Page, name: string): Promise<void> {
  fs.mkdirSync(OUTPUT_DIR, { recursive: true });
  await page.screenshot({ path: path.join(OUTPUT_DIR, `${name}.png`), fullPage: true });
}
