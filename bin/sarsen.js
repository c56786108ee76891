#!/usr/bin/env node
// The `sarsen` command: the compiled build when there is one (the image, a package built with
// `npm run build`), else the TypeScript sources, which Node 24 runs directly (a checkout:
// `npx sarsen ...`).
import fs from 'node:fs';

const compiled = new URL('../dist/src/main.js', import.meta.url);
await import(fs.existsSync(compiled) ? compiled.href : new URL('../src/main.ts', import.meta.url).href);
