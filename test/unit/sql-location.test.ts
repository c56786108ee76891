// CONTRIBUTING.md "Where code goes": SQL lives in src/db/ only. Every other layer calls a src/db/
// function, so the statements a process can run are read in one place. This reads the source
// of every other layer for a statement in a string literal or a query run on a connection.
import { expect } from 'chai';
import fs from 'node:fs';
import path from 'node:path';

const SRC = path.join(import.meta.dirname, '..', '..', 'src');
const DB = path.join(SRC, 'db');

// A string literal that opens with a statement's first word, or a query run on a connection.
// Read across lines: a template literal may open at a line's end and its statement start below.
const STATEMENT = /['"`]\s*(SELECT|INSERT|UPDATE|DELETE|WITH|LISTEN|UNLISTEN|NOTIFY|BEGIN|COMMIT|ROLLBACK|SET|SHOW|CREATE|ALTER|DROP|TRUNCATE|VACUUM|ANALYZE|LOCK)\s/g;
const QUERY_CALL = /\.query\s*(<[^>]*>)?\s*\(/g;

function sourceFiles(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) return p === DB ? [] : sourceFiles(p);
    return p.endsWith('.ts') ? [p] : [];
  });
}

// Comments may name statements (a trigger's NOTIFY, a DELETE route); code may not run them.
// Both keep their line breaks, so that what is found keeps its line number.
const withoutComments = (text: string): string =>
  text.replace(/\/\*[\s\S]*?\*\//g, (comment) => comment.replace(/[^\n]/g, '')).replace(/^[ \t]*\/\/.*$/gm, '');

/** Each statement or query call in `text`, as `line: code` (lines from 1) at its first word. */
function statementsIn(text: string): string[] {
  const code = withoutComments(text);
  const lines = code.split('\n');
  const lineAt = (offset: number) => code.slice(0, offset).split('\n').length;
  const at = new Set<number>();
  for (const m of code.matchAll(STATEMENT)) at.add(lineAt(m.index + m[0].lastIndexOf(m[1]!)));
  for (const m of code.matchAll(QUERY_CALL)) at.add(lineAt(m.index));
  return [...at].sort((a, b) => a - b).map((n) => `${n}: ${lines[n - 1]!.trim()}`);
}

describe('where SQL lives', () => {
  it('no layer but src/db/ holds a statement or runs a query', () => {
    const found = sourceFiles(SRC).flatMap((file) => statementsIn(fs.readFileSync(file, 'utf8')).map((s) => `${path.relative(SRC, file)}:${s}`));
    expect(found).to.deep.equal([]);
  });

  it('finds a statement in a template literal that opens at a line end', () => {
    const text = ['const rows = await run(`', '  SELECT id', '    FROM sarsen.requests`);'].join('\n');
    expect(statementsIn(text)).to.deep.equal(['2: SELECT id']);
  });

  it('passes over statements comments name, and counts lines past them', () => {
    const text = ['/* a trigger sends', '   NOTIFY "sarsen" */', '// DELETE /requests/:id', 'const sql = "SELECT 1";'].join('\n');
    expect(statementsIn(text)).to.deep.equal(['4: const sql = "SELECT 1";']);
  });
});
