// CONTRIBUTING.md "Where code goes": SQL lives in src/db/ only. Every other layer calls a src/db/
// function, so the statements a process can run are read in one place. This reads the source
// of every other layer for a statement in a string literal or a query run on a connection.
import { expect } from 'chai';
import fs from 'node:fs';
import path from 'node:path';

const SRC = path.join(import.meta.dirname, '..', '..', 'src');
const DB = path.join(SRC, 'db');

// A string literal that opens with a statement's first word, or a query run on a connection.
const STATEMENT = /['"`]\s*(SELECT|INSERT|UPDATE|DELETE|WITH|LISTEN|UNLISTEN|NOTIFY|BEGIN|COMMIT|ROLLBACK|SET|SHOW|CREATE|ALTER|DROP|TRUNCATE|VACUUM|ANALYZE|LOCK)\s/;
const QUERY_CALL = /\.query\s*(<[^>]*>)?\s*\(/;

function sourceFiles(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) return p === DB ? [] : sourceFiles(p);
    return p.endsWith('.ts') ? [p] : [];
  });
}

// Comments may name statements (a trigger's NOTIFY, a DELETE route); code may not run them.
const withoutComments = (text: string): string => text.replace(/\/\*[\s\S]*?\*\//g, '').replace(/^\s*\/\/.*$/gm, '');

describe('where SQL lives', () => {
  it('no layer but src/db/ holds a statement or runs a query', () => {
    const found: string[] = [];
    for (const file of sourceFiles(SRC)) {
      withoutComments(fs.readFileSync(file, 'utf8')).split('\n').forEach((line, i) => {
        if (STATEMENT.test(line) || QUERY_CALL.test(line)) found.push(`${path.relative(SRC, file)}: ${line.trim()}`);
      });
    }
    expect(found).to.deep.equal([]);
  });
});
