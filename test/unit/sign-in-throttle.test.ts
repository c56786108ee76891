import { expect } from 'chai';
import crypto from 'node:crypto';
import { clientAddress, addressBucket, throttleKeys } from '../../src/core/sign-in-throttle.ts';

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
      expect(keys('acme', 'a@b', '192.0.2.1', crypto.randomBytes(32)).account).to.not.deep.equal(k.account);
      expect(keys('x', 'y', '::ffff:192.0.2.1').address).to.deep.equal(k.address);
    });

    it('cannot be made to collide by moving text between tenancy and email', () => {
      expect(keys('a', 'b@c').account).to.not.deep.equal(keys('ab', '@c').account);
    });
  });
});
