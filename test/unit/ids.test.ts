import { expect } from 'chai';
import { createIdGenerator, idTime, isId, newId, randomChars } from '../../src/core/ids.ts';

const ULID_TEXT = /^[0-9A-HJKMNP-TV-Z]{26}$/;

describe('ids', () => {
  it('formats prefix, underscore and a 26-character Crockford ULID', () => {
    for (const prefix of ['req', 'bk', 'rule', 'key', 'usr', 'ns', 'ten', 'ses']) {
      const id = newId(prefix);
      expect(id.startsWith(`${prefix}_`)).to.equal(true);
      expect(id.slice(prefix.length + 1)).to.match(ULID_TEXT);
      expect(isId(id, prefix)).to.equal(true);
    }
  });

  it('rejects a prefix that would make the id ambiguous', () => {
    expect(() => newId('a_b')).to.throw(TypeError);
    expect(() => newId('')).to.throw(TypeError);
    expect(() => newId('REQ')).to.throw(TypeError);
  });

  it('encodes the creation time, which idTime reads back', () => {
    const before = Date.now();
    const id = newId('req');
    const after = Date.now();
    expect(idTime(id)).to.be.within(before, after);
    const gen = createIdGenerator(() => 1_700_000_000_123);
    expect(idTime(gen('bk'))).to.equal(1_700_000_000_123);
    expect(idTime(createIdGenerator(() => 0)('bk'))).to.equal(0);
    expect(idTime(createIdGenerator(() => 2 ** 48 - 1)('bk'))).to.equal(2 ** 48 - 1);
  });

  it('sorts later times after earlier ones', () => {
    let t = 1000;
    const gen = createIdGenerator(() => t);
    const a = gen('req');
    t = 1001;
    const b = gen('req');
    t = 40_000_000_000_000;
    const c = gen('req');
    expect([c, b, a].sort()).to.deep.equal([a, b, c]);
  });

  it('is monotonic within one millisecond and when the clock steps back', () => {
    let t = 5_000;
    const gen = createIdGenerator(() => t);
    const ids: string[] = [];
    for (let i = 0; i < 2000; i++) {
      if (i === 1000) t = 4_000; // clock stepped backwards
      ids.push(gen('req'));
    }
    expect(new Set(ids).size).to.equal(ids.length);
    expect([...ids].sort()).to.deep.equal(ids);
    expect(idTime(ids[1999])).to.equal(5_000);
  });

  it('default generator keeps creation order across a burst', () => {
    const ids = Array.from({ length: 5000 }, () => newId('req'));
    expect([...ids].sort()).to.deep.equal(ids);
  });

  it('draws fresh randomness in a new millisecond', () => {
    let t = 1;
    const gen = createIdGenerator(() => t);
    const a = gen('x').slice(12);
    t = 2;
    const b = gen('x').slice(12);
    expect(a).to.not.equal(b);
  });

  it('idTime and isId refuse malformed ids', () => {
    for (const bad of ['req', 'req_', 'req_123', `req_${'I'.repeat(26)}`, `req_8${'0'.repeat(25)}`, `_${'0'.repeat(26)}`]) {
      expect(isId(bad), bad).to.equal(false);
      expect(() => idTime(bad), bad).to.throw(TypeError);
    }
    expect(isId(newId('req'), 'bk')).to.equal(false);
    expect(isId(42)).to.equal(false);
  });

  it('randomChars uses only the alphabet, at the requested length, roughly uniformly', () => {
    const s = randomChars('abc', 30_000);
    expect(s).to.have.length(30_000);
    expect(s).to.match(/^[abc]+$/);
    // With modulo bias 256 % 3 = 1 the first letter would win ~0.4% more; here we only
    // check each letter lands near a third.
    for (const ch of 'abc') {
      const n = s.split(ch).length - 1;
      expect(n).to.be.within(9_400, 10_600);
    }
    expect(() => randomChars('a', 3)).to.throw(RangeError);
  });
});
