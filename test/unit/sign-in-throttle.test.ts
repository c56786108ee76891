import { expect } from 'chai';
import crypto from 'node:crypto';
import { clientAddress, addressBucket, throttleKeys, refusal, type Count } from '../../src/core/sign-in-throttle.ts';

describe('sign-in throttle keys', () => {
  describe('clientAddress', () => {
    it('is the socket peer when no proxy is trusted, whatever X-Forwarded-For says', () => {
      expect(clientAddress('192.0.2.1', '203.0.113.5', 0)).to.equal('192.0.2.1');
      expect(clientAddress('192.0.2.1', undefined, 0)).to.equal('192.0.2.1');
    });

    it('with trusted proxies, is the entry the outermost trusted proxy wrote', () => {
      expect(clientAddress('10.0.0.2', 'forged, 203.0.113.5', 1)).to.equal('203.0.113.5');
      expect(clientAddress('10.0.0.2', 'forged, 203.0.113.5, 10.0.0.1', 2)).to.equal('203.0.113.5');
      expect(clientAddress('10.0.0.2', ['forged', '203.0.113.5'], 1)).to.equal('203.0.113.5'); // repeated headers
    });

    it('with fewer entries than trusted hops, takes the leftmost', () => {
      expect(clientAddress('10.0.0.2', '203.0.113.5', 3)).to.equal('203.0.113.5');
      expect(clientAddress('10.0.0.2', '', 1)).to.equal('10.0.0.2');
    });
  });

  describe('addressBucket', () => {
    it('counts IPv4 as itself, v4-mapped IPv6 as the IPv4 address it carries', () => {
      expect(addressBucket('192.0.2.1')).to.equal('192.0.2.1');
      expect(addressBucket('::ffff:192.0.2.1')).to.equal('192.0.2.1');
      expect(addressBucket('::ffff:c000:0201')).to.equal('192.0.2.1');
    });

    it('counts IPv6 by its /64, however it is written', () => {
      expect(addressBucket('2001:db8:1:2::1')).to.equal('2001:db8:1:2::/64');
      expect(addressBucket('2001:0DB8:0001:0002:ffff:0:0:9')).to.equal('2001:db8:1:2::/64');
      expect(addressBucket('2001:db8:1:3::1')).to.not.equal(addressBucket('2001:db8:1:2::1'));
    });

    it('keeps anything else as its lower-cased text', () => {
      expect(addressBucket('Unknown')).to.equal('unknown');
    });
  });

  describe('throttleKeys', () => {
    const secret = crypto.randomBytes(32);
    const keys = (tenancy: string, email: string, address = '192.0.2.1', s = secret) => throttleKeys(s, { tenancy, email, address });

    it('names an account by tenancy and normalised email', () => {
      expect(keys('acme', ' Ops@Acme.Example ').account).to.deep.equal(keys('acme', 'ops@acme.example').account);
      expect(keys('acme', 'ops@acme.example').account).to.not.deep.equal(keys('other', 'ops@acme.example').account);
      expect(keys('acme', 'a@b').account).to.not.deep.equal(keys('acme', 'a@c').account);
    });

    it('keeps account and address keys apart, and depends on the secret', () => {
      const k = keys('acme', 'a@b');
      expect(k.account).to.not.deep.equal(k.address);
      expect(k.pair).to.not.deep.equal(k.account);
      expect(k.pair).to.not.deep.equal(k.address);
      expect(keys('acme', 'a@b', '192.0.2.1', crypto.randomBytes(32)).account).to.not.deep.equal(k.account);
      expect(keys('x', 'y', '::ffff:192.0.2.1').address).to.deep.equal(k.address);
    });

    it('cannot be made to collide by moving text between tenancy and email', () => {
      expect(keys('a', 'b@c').account).to.not.deep.equal(keys('ab', '@c').account);
    });

    it('names a pair by account and address bucket: one account from two addresses is two pairs, one /64 is one', () => {
      expect(keys('acme', 'a@b', '192.0.2.1').pair).to.not.deep.equal(keys('acme', 'a@b', '192.0.2.2').pair);
      expect(keys('acme', 'a@b', '192.0.2.1').account).to.deep.equal(keys('acme', 'a@b', '192.0.2.2').account);
      expect(keys('acme', 'A@B', '2001:db8::1').pair).to.deep.equal(keys('acme', 'a@b', '2001:db8::2').pair);
    });
  });

  describe('refusal', () => {
    const limits = { perAccountAddress: 10, perAddress: 100, perAccount: 1000 };
    const n = (attempts: number, retryAfterSeconds = 600): Count => ({ attempts, retryAfterSeconds });

    it('lets an attempt through while every count is within its limit', () => {
      expect(refusal({ pair: n(10), account: n(1000), address: n(100) }, limits)).to.equal(0);
    });

    it('refuses an address past its limit on the account, or past its own limit, until that window ends', () => {
      expect(refusal({ pair: n(11, 300), account: n(11), address: n(11) }, limits)).to.equal(300);
      expect(refusal({ pair: n(1), account: n(1), address: n(101, 200) }, limits)).to.equal(200);
      expect(refusal({ pair: n(11, 300), account: n(11), address: n(101, 200) }, limits)).to.equal(300);
    });

    it('past the account ceiling refuses only an address that already tried the account, until either window ends', () => {
      expect(refusal({ pair: n(1), account: n(5000, 900), address: n(1) }, limits)).to.equal(0);
      expect(refusal({ pair: n(2, 120), account: n(5000, 900), address: n(2) }, limits)).to.equal(120);
      expect(refusal({ pair: n(2, 800), account: n(1001, 90), address: n(2) }, limits)).to.equal(90);
    });
  });
});
