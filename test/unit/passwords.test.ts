import { expect } from 'chai';
import {
  generatePassword,
  hashPassword,
  SCRYPT_N,
  SCRYPT_P,
  SCRYPT_R,
  verifyAgainstDummy,
  verifyPassword,
} from '../../src/core/passwords.ts';

describe('passwords', () => {
  let encoded = '';
  before(async () => {
    encoded = await hashPassword('correct horse battery staple');
  });

  it('encodes as scrypt$N$r$p$salt$hash with the documented parameters', () => {
    const parts = encoded.split('$');
    expect(parts).to.have.length(6);
    expect(parts.slice(0, 4)).to.deep.equal(['scrypt', String(SCRYPT_N), String(SCRYPT_R), String(SCRYPT_P)]);
    expect([SCRYPT_N, SCRYPT_R, SCRYPT_P]).to.deep.equal([16384, 8, 1]);
    expect(Buffer.from(parts[4], 'base64')).to.have.length(16);
    expect(Buffer.from(parts[5], 'base64')).to.have.length(32);
    expect(encoded).to.not.contain('correct horse');
  });

  it('verifies the right password and refuses a wrong one', async () => {
    expect(await verifyPassword('correct horse battery staple', encoded)).to.equal(true);
    expect(await verifyPassword('correct horse battery stapl', encoded)).to.equal(false);
    expect(await verifyPassword('Correct horse battery staple', encoded)).to.equal(false);
    expect(await verifyPassword('', encoded)).to.equal(false);
  });

  it('salts per hash: one password hashes differently twice, and both verify', async () => {
    const again = await hashPassword('correct horse battery staple');
    expect(again).to.not.equal(encoded);
    expect(again.split('$')[4]).to.not.equal(encoded.split('$')[4]);
    expect(await verifyPassword('correct horse battery staple', again)).to.equal(true);
  });

  it('treats canonically equivalent Unicode spellings as the same password', async () => {
    const composed = 'caf\u00e9-pässwörd';
    const decomposed = composed.normalize('NFD');
    expect(decomposed).to.not.equal(composed);
    const h = await hashPassword(composed);
    expect(await verifyPassword(decomposed, h)).to.equal(true);
  });

  it('verifies against the parameters stored in the string, not the current ones', async () => {
    // A hash made with cheaper parameters must still verify after the defaults change.
    const { scrypt } = await import('node:crypto');
    const salt = Buffer.alloc(16, 7);
    const hash = await new Promise<Buffer>((resolve, reject) =>
      scrypt('old password', salt, 32, { N: 1024, r: 8, p: 1 }, (e, k) => (e ? reject(e) : resolve(k))));
    const old = `scrypt$1024$8$1$${salt.toString('base64')}$${hash.toString('base64')}`;
    expect(await verifyPassword('old password', old)).to.equal(true);
    expect(await verifyPassword('other password', old)).to.equal(false);
  });

  it('answers false, never throws, for malformed encoded strings', async () => {
    const [, , , , salt, hash] = encoded.split('$');
    const bad = [
      '',
      'scrypt',
      'bcrypt$16384$8$1$' + salt + '$' + hash,
      `scrypt$16384$8$1$${salt}`,
      `scrypt$16384$8$1$${salt}$${hash}$extra`,
      `scrypt$16383$8$1$${salt}$${hash}`, // N not a power of two
      `scrypt$0$8$1$${salt}$${hash}`,
      `scrypt$-16384$8$1$${salt}$${hash}`,
      `scrypt$1048576$32$16$${salt}$${hash}`, // would demand gigabytes
      `scrypt$16384$8$1$!!!$${hash}`,
      `scrypt$16384$8$1$${salt}$`,
      `scrypt$16384$8$1$${salt}$AAAA`, // hash too short
      `scrypt$abc$8$1$${salt}$${hash}`,
      'x'.repeat(10_000),
    ];
    for (const b of bad) {
      expect(await verifyPassword('correct horse battery staple', b), b.slice(0, 60)).to.equal(false);
    }
    expect(await verifyPassword('x', null as unknown as string)).to.equal(false);
    expect(await verifyPassword(undefined as unknown as string, encoded)).to.equal(false);
  });

  it('verifyAgainstDummy answers false for any input', async () => {
    expect(await verifyAgainstDummy('correct horse battery staple')).to.equal(false);
    expect(await verifyAgainstDummy('')).to.equal(false);
  });

  it('generates long, unambiguous, distinct passwords', () => {
    const seen = new Set<string>();
    for (let i = 0; i < 300; i++) {
      const pw = generatePassword();
      expect(pw.length).to.be.at.least(20);
      expect(pw).to.match(/^[A-Za-z0-9]+$/);
      expect(pw).to.not.match(/[0O1lIo]/);
      seen.add(pw);
    }
    expect(seen.size).to.equal(300);
  });
});
