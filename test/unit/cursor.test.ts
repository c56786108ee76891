import { expect } from 'chai';
import crypto from 'node:crypto';
import { encodeCursor, decodeCursor } from '../../src/core/cursor.ts';

describe('paging cursors', () => {
  const key = crypto.randomBytes(32);
  it('round-trips a position within its scope', () => {
    const c = encodeCursor(key, 'ns_a', 'req_01ARZ3NDEKTSV4RRFFQ69G5FAV');
    expect(decodeCursor(key, 'ns_a', c)).to.equal('req_01ARZ3NDEKTSV4RRFFQ69G5FAV');
  });
  it('refuses another scope, another key, tampering and garbage', () => {
    const c = encodeCursor(key, 'ns_a', 'req_1');
    expect(decodeCursor(key, 'ns_b', c)).to.equal(null);
    expect(decodeCursor(crypto.randomBytes(32), 'ns_a', c)).to.equal(null);
    const forged = `${Buffer.from('req_2').toString('base64url')}.${c.split('.')[1]}`;
    expect(decodeCursor(key, 'ns_a', forged)).to.equal(null);
    for (const bad of ['', '.', 'abc', 'abc.def', `${c}x`, c.replace('.', '')]) expect(decodeCursor(key, 'ns_a', bad)).to.equal(null);
  });
});
