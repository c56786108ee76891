// One table of codes (src/core/errors.ts), documented in docs/api.md "Errors"; this checks
// the page lists it and that each code is actually raised.
import { expect } from 'chai';
import fs from 'node:fs';
import path from 'node:path';
import { ERROR_CODES } from '../../src/core/errors.ts';

// The codes Sarsen started with, in the page's order (statuses and codes).
const BASE_TABLE: [number, string][] = [
  [400, 'bad_request'], [400, 'sarsen_key_forwarded'], [401, 'unauthorised'], [401, 'provider_credential'],
  [401, 'caller_credential_missing'], [402, 'insufficient_credits'], [402, 'spend_limit_reached'], [403, 'forbidden'],
  [403, 'password_change_required'], [403, 'password_rejected'], [404, 'not_found'], [409, 'conflict'],
  [410, 'record_expired'], [413, 'body_too_large'], [415, 'unsupported_media_type'], [422, 'unprocessable_entity'],
  [422, 'backend_host_refused'], [422, 'passthrough_disabled'], [500, 'internal'], [502, 'upstream_failed'],
  [504, 'held_too_long'], [508, 'loop_detected'],
];
// Codes added since (rate limits, sign-in throttle, cancel, outages), in their place by status.
const ADDITIONS: [number, string][] = [[429, 'rate_limited'], [429, 'too_many_attempts'], [499, 'cancelled'], [503, 'unavailable']];
const TABLE = [...BASE_TABLE, ...ADDITIONS].sort((a, b) => a[0] - b[0]); // stable: the page's order within a status

// Codes whose feature has not landed yet. This list must only shrink: the test fails when a
// code here starts being raised (so it is removed) or one not here is never raised.
const NOT_YET_RAISED = new Set<string>([]);

// The ways src/ turns a code into an error a caller sees: the error type, the error answer
// written directly, a stored error answer, and the metering refusal (thrown as a ServiceError
// with its code by the submission route). Each pattern captures the code, a string literal.
const RAISERS: [string, RegExp][] = [
  ['new ServiceError', /new ServiceError\(\s*'([a-z_]+)'/g],
  ['sendError', /sendError\(\s*\w+,\s*'([a-z_]+)'/g],
  ['errorBody', /errorBody\(\s*'([a-z_]+)'/g],
  ['new MeteringRefusal', /new MeteringRefusal\(\s*'([a-z_]+)'/g],
];

function sourceFiles(dir: string): string[] {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    return e.isDirectory() ? sourceFiles(p) : p.endsWith('.ts') ? [p] : [];
  });
}

describe('error codes', () => {
  it('the table is exactly the base table and the codes added since, in order, with their statuses', () => {
    expect(Object.entries(ERROR_CODES).map(([code, v]) => [v.status, code])).to.deep.equal(TABLE);
  });

  it('every code is documented in docs/api.md with its status, and nothing else is', () => {
    const readme = fs.readFileSync('docs/api.md', 'utf8');
    const section = readme.slice(readme.indexOf('## Errors'), readme.indexOf('\n## ', readme.indexOf('## Errors') + 1));
    const rows = [...section.matchAll(/^\| (\d{3}) \| `([a-z_]+)` \|$/gm)].map((m) => [Number(m[1]), m[2]]);
    expect(rows).to.deep.equal(TABLE);
  });

  it('every code is raised somewhere in src/ (a ServiceError or an error answer made with it), except those not built yet', () => {
    const sources = sourceFiles('src').map((f) => fs.readFileSync(f, 'utf8')).join('\n');
    const raised = new Set<string>();
    for (const [how, pattern] of RAISERS) {
      const codes = [...sources.matchAll(pattern)].map((m) => m[1]!);
      expect(codes, `no code raised through ${how}: has it been renamed? (then update RAISERS)`).to.not.deep.equal([]);
      for (const code of codes) {
        expect(ERROR_CODES, `${how} raises ${code}, which is not in the table`).to.have.property(code);
        raised.add(code);
      }
    }
    for (const code of Object.keys(ERROR_CODES)) {
      expect(raised.has(code), `${code} raised: ${raised.has(code)}, listed as not yet raised: ${NOT_YET_RAISED.has(code)}`).to.equal(
        !NOT_YET_RAISED.has(code),
      );
    }
  });
});
