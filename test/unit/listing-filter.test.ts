import { expect } from 'chai';
import { parseListingFilter, parseInstant, cursorScope } from '../../src/core/listing-filter.ts';
import { ServiceError } from '../../src/core/errors.ts';
import { createIdGenerator, firstIdAt } from '../../src/core/ids.ts';

const parse = (q: Record<string, string>) => parseListingFilter((name) => q[name]);
const refused = (fn: () => unknown) => expect(fn).to.throw(ServiceError).with.property('code', 'bad_request');

describe('listing filters', () => {
  it('parses every filter, and none', () => {
    expect(parse({})).to.deep.equal({});
    const key = createIdGenerator()('key');
    expect(parse({ status: 'failed', model: 'gpt-4o', api_key_id: key, created_since: '0', created_before: '2026-03-01T12:00:00.5+02:00' })).to.deep.equal({
      status: 'failed', model: 'gpt-4o', api_key_id: key, created_since: new Date(0), created_before: new Date('2026-03-01T10:00:00.500Z'),
    });
  });

  it('refuses what is not a status, a model, a key id or an instant with an offset', () => {
    const bad: Record<string, string>[] = [{ status: 'done' }, { model: '' }, { model: 'x'.repeat(513) }, { model: 'a\u0000b' }, { api_key_id: 'req_01ARZ3NDEKTSV4RRFFQ69G5FAV' }, { api_key_id: 'ci' }];
    for (const q of bad) {
      refused(() => parse(q));
    }
    for (const v of ['', '-1', '1.5', '1e3', 'yesterday', '2026-03-01', '2026-03-01T12:00:00', '2026-02-30T00:00:00Z', '2026-03-01T25:00:00Z', '2026-03-01T24:00:00Z', '2026-03-01T12:00:00+24:00', '9'.repeat(16)]) {
      refused(() => parseInstant('created_since', v));
    }
  });

  it('parses the dialect filter: one of the three dialects, nothing else; it scopes cursors too', () => {
    for (const dialect of ['chat', 'messages', 'responses']) expect(parse({ dialect })).to.deep.equal({ dialect });
    for (const dialect of ['', 'Chat', 'completions', 'responses ']) refused(() => parse({ dialect }));
    expect(cursorScope('ns_a', { dialect: 'responses' })).to.not.equal(cursorScope('ns_a', { dialect: 'chat' }));
  });

  it('scopes cursors by namespace and filter, canonically; no filter is the namespace alone', () => {
    expect(cursorScope('ns_a', {})).to.equal('ns_a');
    const a = cursorScope('ns_a', { model: 'm', status: 'failed' });
    expect(a).to.equal(cursorScope('ns_a', { status: 'failed', model: 'm' }));
    expect(new Set([a, cursorScope('ns_b', { model: 'm', status: 'failed' }), cursorScope('ns_a', { model: 'm' }), cursorScope('ns_a', {})]).size).to.equal(4);
    expect(cursorScope('ns_a', { created_since: new Date(5) })).to.not.equal(cursorScope('ns_a', { created_since: new Date(6) }));
  });

  it('firstIdAt sorts below every id made at that millisecond or later and above every earlier one', () => {
    let now = 1_700_000_000_000;
    const next = createIdGenerator(() => now);
    const earlier = next('req');
    now += 1;
    const at = next('req');
    now += 1000;
    const later = next('req');
    const floor = firstIdAt('req', now - 1000);
    expect([earlier < floor, floor <= at, floor < later]).to.deep.equal([true, true, true]);
    expect(firstIdAt('req', -5)).to.equal(`req_${'0'.repeat(26)}`);
  });
});
