// Headless Chromium driven by playwright-core, for the console's tests.
// A fresh profile per launch; screenshots go under the run's output folder.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { brotliDecompress as brotliDecompressCallback, createBrotliDecompress } from 'node:zlib';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { track } from './resources.ts';
import { extractTar } from './untar.ts';

export const OUTPUT_DIR = path.resolve(process.env.SARSEN_TEST_OUTPUT ?? 'test-output', 'console');
const DEBIAN_CHROMIUM = '/usr/bin/chromium';
const brotliDecompress = promisify(brotliDecompressCallback);

type Chromium = { executablePath: string; libraryPath?: string };

/**
 * `SARSEN_CHROMIUM` (a path, or `bundled`), else Debian's chromium, else the one shipped inside
 * @sparticuz/chromium: browser packages that download at install or first use cannot work on our
 * machines. Its binary needs libc and libgcc_s from the system, and NSS, NSPR and expat from the
 * folder the package ships them in (bin/al2023.tar.br); it runs headless as root here.
 */
async function chooseChromium(): Promise<Chromium> {
  const chosen = process.env.SARSEN_CHROMIUM;
  if (chosen && chosen !== 'bundled') return { executablePath: chosen };
  if (!chosen && fs.existsSync(DEBIAN_CHROMIUM)) return { executablePath: DEBIAN_CHROMIUM };
  return (bundled ??= unpackBundled());
}
let bundled: Promise<Chromium> | undefined;

/**
 * Unpacks the package's binary and its libraries once per version into the temporary folder,
 * each under a name of its own and by rename, so concurrent runs never start a half-written one.
 */
async function unpackBundled(): Promise<Chromium> {
  // The package exports only its script (build/index.js); its folder is two levels up.
  const pkg = path.dirname(path.dirname(fileURLToPath(import.meta.resolve('@sparticuz/chromium'))));
  const { version } = JSON.parse(fs.readFileSync(path.join(pkg, 'package.json'), 'utf8')) as { version: string };
  const dir = path.join(os.tmpdir(), `sarsen-bundled-chromium-${version}`);
  fs.mkdirSync(dir, { recursive: true });
  const executablePath = path.join(dir, 'chromium');
  if (!fs.existsSync(executablePath)) {
    const partial = `${executablePath}.${process.pid}.partial`;
    await pipeline(
      fs.createReadStream(path.join(pkg, 'bin', 'chromium.br')),
      createBrotliDecompress(),
      fs.createWriteStream(partial, { mode: 0o755 }),
    );
    fs.renameSync(partial, executablePath);
  }
  // The archive holds lib/*.so; the folder appears whole or not at all.
  const libraries = path.join(dir, 'al2023');
  if (!fs.existsSync(libraries)) {
    const partial = `${libraries}.${process.pid}.partial`;
    fs.rmSync(partial, { recursive: true, force: true });
    fs.mkdirSync(partial);
    extractTar(await brotliDecompress(fs.readFileSync(path.join(pkg, 'bin', 'al2023.tar.br'))), partial);
    try {
      fs.renameSync(partial, libraries);
    } catch (err) {
      // Another run renamed its copy first: use that one.
      fs.rmSync(partial, { recursive: true, force: true });
      if (!fs.existsSync(libraries)) throw err;
    }
  }
  return { executablePath, libraryPath: path.join(libraries, 'lib') };
}

export type TestBrowser = { context: BrowserContext; page: Page; close(): Promise<void> };

/** One Chromium with a fresh --user-data-dir (playwright passes it for a persistent context). */
export async function launchBrowser(): Promise<TestBrowser> {
  const { executablePath, libraryPath } = await chooseChromium();
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath,
    env: libraryPath === undefined ? undefined : {
      ...process.env,
      LD_LIBRARY_PATH: [libraryPath, process.env.LD_LIBRARY_PATH].filter(Boolean).join(':'),
    },
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
  const release = track('browser', executablePath);
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

/** Signs `account` in through the console's own form at `url` and waits for its first page. */
export async function signIn(page: Page, url: string, account: { tenancy: string; email: string; password: string }): Promise<void> {
  await page.goto(`${url}/console/`);
  await page.getByLabel('Tenancy').fill(account.tenancy);
  await page.getByLabel('Email').fill(account.email);
  await page.getByLabel('Password').fill(account.password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { level: 1, name: 'Namespaces' }).waitFor();
}
