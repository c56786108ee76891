// One table of codes (src/core/errors.ts), documented in docs/api.md "Errors"; this checks
// the table and that the page lists it. That each code is raised, with its status and the
// envelope, is test/integration/error-codes.test.ts's: it provokes every one over HTTP.
import { expect } from 'chai';
import fs from 'node:fs';
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
});
