// The stateless comparator of the side-by-side benchmark: Portkey's open-source gateway
// (`@portkey-ai/gateway`, no storage), installed from npm into bench/gateway/ on first use
// (never by the top-level npm ci) and run as a child process. It forwards to the same
// provider through its custom-host headers. Its streaming needs `@hono/node-server` 1.13.5,
// pinned in bench/gateway/package.json through npm `overrides` (a known upstream bug).
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { spawnNode, type SarsenChild } from '../../test/support/child.ts';
import { freePort } from '../../src/db/embedded.ts';

const DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../gateway');
const ENTRY = path.join(DIR, 'node_modules/@portkey-ai/gateway/build/start-server.js');

export type Gateway = { url: string; pid: number; version: string; headers(providerUrl: string): Record<string, string>; stop(): Promise<void> };

function install(): void {
  if (fs.existsSync(ENTRY)) return;
  process.stderr.write('[bench] installing the comparator gateway into bench/gateway (npm ci, once)\n');
  execFileSync('npm', ['ci', '--no-audit', '--no-fund', '--prefix', DIR], { stdio: ['ignore', 'ignore', 'inherit'] });
}

export async function startGateway(): Promise<Gateway> {
  install();
  const version = (JSON.parse(fs.readFileSync(path.join(DIR, 'node_modules/@portkey-ai/gateway/package.json'), 'utf8')) as { version: string }).version;
  const port = await freePort();
  const child: SarsenChild = spawnNode(ENTRY, [`--port=${port}`, '--headless'], process.env, 'portkey gateway');
  try {
    await child.waitFor(/Ready for connections/, 60_000);
  } catch (err) {
    await child.kill('SIGKILL');
    throw err;
  }
  return {
    url: `http://127.0.0.1:${port}`,
    version,
    headers: (providerUrl) => ({ 'x-portkey-provider': 'openai', 'x-portkey-custom-host': `${providerUrl}/v1` }),
    pid: child.child.pid!,
    stop: async () => void (await child.kill('SIGTERM')),
  };
}
