// Helpers shared by the client recipes and the durable fetch suites.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/**
 * A directory whose node_modules holds the project's packages and `sarsen` itself (a link to this
 * checkout, as `npm install ../sarsen` makes), so a recipe imports `sarsen/client` as an
 * application would. The caller removes it.
 */
export function recipeDir(): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-recipes-'));
  const modules = path.join(dir, 'node_modules');
  fs.mkdirSync(modules);
  const ours = path.resolve('node_modules');
  for (const name of fs.readdirSync(ours)) fs.symlinkSync(path.join(ours, name), path.join(modules, name));
  fs.symlinkSync(path.resolve('.'), path.join(modules, 'sarsen'), 'dir');
  return dir;
}

/** The fenced block under `<!-- MARKER: name -->` in a docs page. */
export function docBlock(page: string, marker: string, name: string): string {
  const text = fs.readFileSync(page, 'utf8');
  const m = new RegExp(`<!-- ${marker}: ${name} -->\\n\`\`\`\\w+\\n([\\s\\S]*?)\\n\`\`\``).exec(text);
  if (!m) throw new Error(`no ${marker} ${name} in ${page}`);
  return `${m[1]!}\n`;
}
