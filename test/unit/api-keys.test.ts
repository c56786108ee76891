import { expect } from 'chai';
import {
  API_KEY_SECRET_LENGTH,
  generateApiKey,
  hashApiKeySecret,
  looksLikeSarsenKey,
  parseApiKey,
  verifyApiKeySecret,
} from '../../src/core/api-keys.ts';

const HASH_KEY = 'deployment api-key-hash-key for tests';
const P = 'AbCd1234';
const S = 'x'.repeat(32) + 'Y9';

describe('api-keys', () => {
  it('generates sar_<8>_<secret> from [A-Za-z0-9], and parses back to its halves', () => {
    for (let i = 0; i < 200; i++) {
      const { key, prefix, secret } = generateApiKey();
      expect(prefix).to.match(/^[A-Za-z0-9]{8}$/);
      expect(secret).to.match(/^[A-Za-z0-9]+$/);
      expect(secret.length).to.be.at.least(32);
      expect(secret.length).to.equal(API_KEY_SECRET_LENGTH);
      expect(key).to.equal(`sar_${prefix}_${secret}`);
      expect(key.split('_')).to.have.length(3);
      expect(parseApiKey(key)).to.deep.equal({ prefix, secret });
    }
  });

  it('generates distinct keys', () => {
    const keys = new Set(Array.from({ length: 500 }, () => generateApiKey().key));
    const prefixes = new Set(Array.from({ length: 500 }, () => generateApiKey().prefix));
    expect(keys.size).to.equal(500);
    expect(prefixes.size).to.be.greaterThan(495);
  });

  it('parses a well-formed key', () => {
    expect(parseApiKey(`sar_${P}_${S}`)).to.deep.equal({ prefix: P, secret: S });
  });

  it('returns null for anything malformed', () => {
    const bad = [
      '',
      'sar_',
      `sar_${P}`,
      `sar_${P}_`,
      `sar_${P.slice(1)}_${S}`, // prefix 7
      `sar_${P}9_${S}`, // prefix 9
      `sar_${P}_${'a'.repeat(31)}`, // secret too short
      `sar_${P}_${'a'.repeat(129)}`, // secret too long
      `sar_${P}_${S}_extra`, // extra part
      `sar_${P}_${S}_`,
      `sar__${P}_${S}`,
      `SAR_${P}_${S}`,
      `sk_${P}_${S}`,
      `Bearer sar_${P}_${S}`,
      ` sar_${P}_${S}`,
      `sar_${P}_${S} `,
      `sar_${P}_${S}\n`,
      `sar_${P}_${S.slice(0, -1)}-`,
      `sar_Ab/d1234_${S}`,
      `sar_${P}_${S.slice(0, -1)}é`,
      `sar_${P}_${'a'.repeat(300)}`,
    ];
    for (const s of bad) expect(parseApiKey(s), JSON.stringify(s)).to.equal(null);
    expect(parseApiKey(undefined as unknown as string)).to.equal(null);
  });

  it('hashes with HMAC-SHA256 bound to the prefix and the hash key', () => {
    const h = hashApiKeySecret(HASH_KEY, P, S);
    expect(h).to.have.length(32);
    expect(hashApiKeySecret(Buffer.from(HASH_KEY), P, S).equals(h)).to.equal(true);
    expect(hashApiKeySecret(HASH_KEY, 'ZZZZ1234', S).equals(h)).to.equal(false);
    expect(hashApiKeySecret('another hash key', P, S).equals(h)).to.equal(false);
    expect(hashApiKeySecret(HASH_KEY, P, S + 'a').equals(h)).to.equal(false);
    expect(h.toString('latin1')).to.not.contain(S);
    expect(() => hashApiKeySecret('', P, S)).to.throw();
  });

  it('verifies the right secret and refuses everything else, length-safely', () => {
    const { prefix, secret } = generateApiKey();
    const stored = hashApiKeySecret(HASH_KEY, prefix, secret);
    expect(verifyApiKeySecret(HASH_KEY, prefix, secret, stored)).to.equal(true);
    expect(verifyApiKeySecret(HASH_KEY, prefix, secret.slice(1), stored)).to.equal(false);
    expect(verifyApiKeySecret(HASH_KEY, 'otherpfx', secret, stored)).to.equal(false);
    expect(verifyApiKeySecret('wrong key', prefix, secret, stored)).to.equal(false);
    expect(verifyApiKeySecret(HASH_KEY, prefix, secret, stored.subarray(0, 16))).to.equal(false);
    expect(verifyApiKeySecret(HASH_KEY, prefix, secret, Buffer.alloc(0))).to.equal(false);
    expect(verifyApiKeySecret(HASH_KEY, prefix, secret, Buffer.concat([stored, Buffer.from([0])]))).to.equal(false);
  });

  it('spots a Sarsen key in a header value, bare or as a bearer token', () => {
    const { key } = generateApiKey();
    for (const v of [key, `Bearer ${key}`, `bearer ${key}`, `BEARER   ${key}`, `  ${key}`, 'sar_truncated']) {
      expect(looksLikeSarsenKey(v), v).to.equal(true);
    }
    for (const v of ['', 'Bearer sk-ant-api03-abc', 'sk-proj-abc', `Basic ${Buffer.from(key).toString('base64')}`, 'Bearer', 'Bearer xsar_abc', 'ssar_abc']) {
      expect(looksLikeSarsenKey(v), v).to.equal(false);
    }
    expect(looksLikeSarsenKey(undefined)).to.equal(false);
  });
});
