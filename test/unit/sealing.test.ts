import { expect } from 'chai';
import { createKeyring, open, seal, sealedKeyVersion } from '../../src/core/sealing.ts';

const SECRET_1 = 'first credential-key secret, long enough to be realistic';
const SECRET_2 = Buffer.from('second secret after rotation 0123456789abcdef', 'utf8');

function unsealCode(fn: () => unknown): unknown {
  try {
    fn();
  } catch (err) {
    return (err as { code?: unknown }).code;
  }
  return 'did not throw';
}

describe('sealing', () => {
  const ring = createKeyring([{ version: 1, secret: SECRET_1 }]);

  it('round-trips, including empty and non-ASCII plaintext', () => {
    for (const text of ['sk-ant-api03-abcdef', '', 'clé ünïcødé 🔑', 'x'.repeat(10_000)]) {
      expect(open(ring, seal(ring, text))).to.equal(text);
      expect(open(ring, seal(ring, text, 'bk_1'), 'bk_1')).to.equal(text);
    }
  });

  it('lays out version, nonce, ciphertext and tag', () => {
    const sealed = seal(ring, 'abc');
    expect(sealed[0]).to.equal(1);
    expect(sealed.length).to.equal(1 + 12 + 3 + 16);
    expect(sealedKeyVersion(sealed)).to.equal(1);
  });

  it('uses a random nonce: two seals of one value differ', () => {
    const a = seal(ring, 'same value');
    const b = seal(ring, 'same value');
    expect(a.equals(b)).to.equal(false);
    expect(a.subarray(1, 13).equals(b.subarray(1, 13))).to.equal(false);
  });

  it('does not contain the plaintext', () => {
    const plaintext = 'sk-ant-api03-PLAINTEXT-MARKER-VALUE';
    const sealed = seal(ring, plaintext);
    expect(sealed.includes(Buffer.from(plaintext))).to.equal(false);
    expect(sealed.includes(Buffer.from('PLAINTEXT'))).to.equal(false);
    expect(sealed.toString('latin1')).to.not.contain('MARKER');
  });

  it('detects a flip of any single byte', () => {
    const sealed = seal(ring, 'credential', 'bk_1');
    for (let i = 0; i < sealed.length; i++) {
      const bad = Buffer.from(sealed);
      bad[i] ^= 0x01;
      expect(unsealCode(() => open(ring, bad, 'bk_1')), `byte ${i}`).to.equal('SARSEN_UNSEAL_FAILED');
    }
  });

  it('refuses truncated and extended values', () => {
    const sealed = seal(ring, 'credential');
    expect(unsealCode(() => open(ring, sealed.subarray(0, sealed.length - 1)))).to.equal('SARSEN_UNSEAL_FAILED');
    expect(unsealCode(() => open(ring, sealed.subarray(0, 20)))).to.equal('SARSEN_UNSEAL_FAILED');
    expect(unsealCode(() => open(ring, Buffer.concat([sealed, Buffer.from([0])])))).to.equal('SARSEN_UNSEAL_FAILED');
    expect(unsealCode(() => open(ring, Buffer.alloc(0)))).to.equal('SARSEN_UNSEAL_FAILED');
  });

  it('binds to the AAD: a wrong or missing AAD fails', () => {
    const sealed = seal(ring, 'credential', 'bk_A');
    expect(unsealCode(() => open(ring, sealed, 'bk_B'))).to.equal('SARSEN_UNSEAL_FAILED');
    expect(unsealCode(() => open(ring, sealed))).to.equal('SARSEN_UNSEAL_FAILED');
    const unbound = seal(ring, 'credential');
    expect(unsealCode(() => open(ring, unbound, 'bk_A'))).to.equal('SARSEN_UNSEAL_FAILED');
  });

  it('keeps opening version 1 values after rotation to version 2, and seals new ones under 2', () => {
    const old = seal(ring, 'old credential', 'bk_1');
    const rotated = createKeyring([
      { version: 1, secret: SECRET_1 },
      { version: 2, secret: SECRET_2 },
    ]);
    expect(rotated.currentVersion).to.equal(2);
    expect(open(rotated, old, 'bk_1')).to.equal('old credential');
    const fresh = seal(rotated, 'new credential', 'bk_1');
    expect(fresh[0]).to.equal(2);
    expect(open(rotated, fresh, 'bk_1')).to.equal('new credential');
    // The old keyring knows nothing of version 2.
    expect(unsealCode(() => open(ring, fresh, 'bk_1'))).to.equal('SARSEN_UNSEAL_FAILED');
  });

  it('honours an explicit current version', () => {
    const pinned = createKeyring([{ version: 1, secret: SECRET_1 }, { version: 2, secret: SECRET_2 }], 1);
    expect(seal(pinned, 'x')[0]).to.equal(1);
  });

  it('derives different keys from different secrets', () => {
    const other = createKeyring([{ version: 1, secret: 'a different secret altogether' }]);
    expect(unsealCode(() => open(other, seal(ring, 'credential')))).to.equal('SARSEN_UNSEAL_FAILED');
  });

  it('refuses bad keyrings', () => {
    expect(() => createKeyring([])).to.throw();
    expect(() => createKeyring([{ version: 0, secret: 'x' }])).to.throw(RangeError);
    expect(() => createKeyring([{ version: 256, secret: 'x' }])).to.throw(RangeError);
    expect(() => createKeyring([{ version: 1, secret: '' }])).to.throw();
    expect(() => createKeyring([{ version: 1, secret: 'a' }, { version: 1, secret: 'b' }])).to.throw();
    expect(() => createKeyring([{ version: 1, secret: 'a' }], 3)).to.throw();
  });

  it('never puts key material or plaintext in error messages', () => {
    const sealed = seal(ring, 'sk-secret-value', 'bk_1');
    let error: unknown = null;
    try {
      open(ring, sealed, 'bk_2');
    } catch (err) {
      error = err;
    }
    // Outside the try: a value that opened under another row id must fail this test.
    expect(error, 'opening under another row id must throw').to.be.instanceOf(Error);
    expect((error as { code?: unknown }).code).to.equal('SARSEN_UNSEAL_FAILED');
    const msg = String((error as Error).message);
    expect(msg).to.not.contain('sk-secret-value');
    expect(msg).to.not.contain(SECRET_1);
  });
});
