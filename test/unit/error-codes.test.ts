// One table of codes (src/core/errors.ts) mirroring SPEC.md's error table with `service`
// rendered as `sarsen`; this checks it is documented in the README and actually raised.
import { expect } from 'chai';
import fs from 'node:fs';
import path from 'node:path';
import { ERROR_CODES } from '../../src/core/errors.ts';

// SPEC.md "Errors", in its order (statuses and codes), with DESIGN.md's renaming.
const SPEC_TABLE: [number, string][] = [
  [400, 'bad_request'], [400, 'sarsen_key_forwarded'], [401, 'unauthorised'], [401, 'provider_credential'],
  [401, 'caller_credential_missing'], [402, 'insufficient_credits'], [402, 'spend_limit_reached'], [403, 'forbidden'],
  [403, 'password_change_required'], [403, 'password_rejected'], [404, 'not_found'], [409, 'conflict'],
  [410, 'record_expired'], [413, 'body_too_large'], [415, 'unsupported_media_type'], [422, 'unprocessable_entity'],
  [422, 'backend_host_refused'], [422, 'passthrough_disabled'], [500, 'internal'], [502, 'upstream_failed'],
  [504, 'held_too_long'], [508, 'loop_detected'],
];
// Codes Sarsen adds to SPEC.md's table, each in its place by status.
const ADDITIONS: [number, string][] = [[429, 'too_many_attempts'], [499, 'cancelled'], [503, 'unavailable']];
const TABLE = [...SPEC_TABLE, ...ADDITIONS].sort((a, b) => a[0] - b[0]); // stable: SPEC.md's order within a status

// Codes whose feature has not landed yet. This list must only shrink: the test fails when a
// code here starts being raised (so it is removed) or one not here is never raised.
const NOT_YET_RAISED = new Set<string>([]);

function sourceFiles(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    return e.isDirectory() ? sourceFiles(p) : p.endsWith('.ts') ? [p] : [];
  });
}

describe('error codes', () => {
  it('the table is exactly SPEC.md\'s and our additions, in order, with their statuses', () => {
    expect(Object.entries(ERROR_CODES).map(([code, v]) => [v.status, code])).to.deep.equal(TABLE);
  });

  it('every code is documented in the README with its status, and nothing else is', () => {
    const readme = fs.readFileSync('README.md', 'utf8');
    const section = readme.slice(readme.indexOf('## Errors'), readme.indexOf('\n## ', readme.indexOf('## Errors') + 1));
    const rows = [...section.matchAll(/^\| (\d{3}) \| `([a-z_]+)` \|$/gm)].map((m) => [Number(m[1]), m[2]]);
    expect(rows).to.deep.equal(TABLE);
  });

  it('every code is raised somewhere in src/ (outside the table), except those not built yet', () => {
    const sources = sourceFiles('src')
      .filter((f) => !f.endsWith(path.join('core', 'errors.ts')))
      .map((f) => fs.readFileSync(f, 'utf8'))
      .join('\n');
    for (const code of Object.keys(ERROR_CODES)) {
      const raised = new RegExp(`['"\`]${code}['"\`]`).test(sources);
      expect(raised, `${code} raised: ${raised}, listed as not yet raised: ${NOT_YET_RAISED.has(code)}`).to.equal(
        !NOT_YET_RAISED.has(code),
      );
    }
  });
});
