#!/usr/bin/env node
// The installed `sarsen` command runs the compiled build (npm run build); in a checkout,
// `npm run sarsen -- <args>` runs the TypeScript sources directly on Node 24.
import '../dist/src/main.js';
