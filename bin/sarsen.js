#!/usr/bin/env node
// The `sarsen` command: the compiled build when there is one (the image, a package built with
// `npm run build`), else the TypeScript sources, which Node 24 runs directly (a checkout:
// `npx sarsen ...`, `npm start`, `npm run sarsen`). It first starts Node again in its own place
// (execve: the same process, no wrapper in front of signals) with the runtime flags the memory
// it may use calls for (src/core/runtime-flags.ts), a container's limit included.
import fs from 'node:fs';
import os from 'node:os';
import { fileURLToPath } from 'node:url';

const compiled = fs.existsSync(new URL('../dist/src/main.js', import.meta.url));
const module = (name) => new URL(compiled ? `../dist/src/${name}.js` : `../src/${name}.ts`, import.meta.url).href;

// Set in the started process: the flags it was given.
const APPLIED = 'SARSEN_RUNTIME_FLAGS';
if (process.env[APPLIED] === undefined) {
  const { runtimeSettings } = await import(module('core/runtime-flags'));
  const given = [...process.execArgv, ...(process.env.NODE_OPTIONS ?? '').split(/\s+/).filter(Boolean)];
  const { flags, env } = runtimeSettings({ constrained: process.constrainedMemory(), total: os.totalmem(), given, env: process.env });
  const argv = [process.execPath, ...process.execArgv, ...flags, fileURLToPath(import.meta.url), ...process.argv.slice(2)];
  try {
    process.execve(process.execPath, argv, { ...process.env, ...env, [APPLIED]: flags.join(' ') });
  } catch (err) {
    process.stderr.write(`sarsen: could not start Node with ${flags.join(' ')} (${err.message}); running without them\n`);
  }
}
await import(module('main'));
