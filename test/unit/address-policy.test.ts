import { expect } from 'chai';
import type { LookupAddress, LookupOptions } from 'node:dns';
import type { LookupFunction } from 'node:net';
import { Agent, request } from 'undici';
import {
  checkHostAllowed,
  HOST_REFUSED_CODE,
  isRefusedAddress,
  parseIPv4,
  parseIPv6,
  policyLookup,
  refusalReason,
} from '../../src/core/address-policy.ts';

const REFUSED: Record<string, string[]> = {
  loopback: ['127.0.0.1', '127.255.255.254', '127.1', '2130706433', '0x7f.1', '::1', '0:0:0:0:0:0:0:1', '::0001'],
  private: [
    '10.0.0.1', '10.255.255.255', '172.16.0.1', '172.31.255.255', '192.168.0.1', '192.168.255.255',
    'fc00::1', 'fd12:3456:789a::1', 'FDFF:ffff::', 'fec0::1',
  ],
  'link-local': ['169.254.0.1', '169.254.169.254', 'fe80::1', 'fe80::1%eth0', 'febf:ffff::1'],
  cgnat: ['100.64.0.1', '100.127.255.255'],
  multicast: ['224.0.0.1', '239.255.255.250', 'ff02::1', 'ff0e::1'],
  unspecified: ['0.0.0.0', '0.1.2.3', '0', '::', '0:0:0:0:0:0:0:0'],
  broadcast: ['255.255.255.255'],
  reserved: ['240.0.0.1', '198.18.0.1', '192.0.0.8'],
  'v4-mapped': ['::ffff:127.0.0.1', '::ffff:7f00:1', '0:0:0:0:0:ffff:10.0.0.1', '::FFFF:192.168.1.1', '::ffff:a9fe:a9fe'],
  'v4-compatible / translated': ['::127.0.0.1', '::10.1.2.3', '::ffff:0:127.0.0.1'],
  nat64: ['64:ff9b::127.0.0.1', '64:ff9b::a00:1', '64:ff9b:1::8.8.8.8'],
  '6to4': ['2002:7f00:1::', '2002:0a00:0001::1', '2002:c0a8:0101:1::'],
};

const ALLOWED = [
  '8.8.8.8', '1.1.1.1', '93.184.216.34', '172.32.0.1', '172.15.255.255', '100.63.255.255', '100.128.0.1',
  '169.253.0.1', '192.169.0.1', '11.0.0.1', '223.255.255.255',
  '2606:4700::1111', '2001:4860:4860::8888', '::ffff:8.8.8.8', '::ffff:808:808', '64:ff9b::8.8.8.8',
  '2002:0808:0808::1', '2606:4700:4700::1111%en0',
];

describe('address-policy', () => {
  describe('isRefusedAddress', () => {
    for (const [range, addresses] of Object.entries(REFUSED)) {
      it(`refuses ${range}`, () => {
        for (const a of addresses) expect(isRefusedAddress(a), a).to.equal(true);
      });
    }

    it('allows public addresses, v4 and v6', () => {
      for (const a of ALLOWED) expect(isRefusedAddress(a), a).to.equal(false);
    });

    it('fails closed on text that is not an address', () => {
      for (const a of ['', 'example.com', '1.2.3.4.5', '256.1.1.1', '1::2::3', '::g', '12345::', '1:2:3:4:5:6:7:8:9', '::1.2.3', 'fe80::1%']) {
        expect(isRefusedAddress(a), a).to.equal(true);
        expect(refusalReason(a), a).to.contain('not an IP address');
      }
    });

    it('names the range and the embedded address in the reason', () => {
      expect(refusalReason('10.1.2.3')).to.contain('private');
      expect(refusalReason('::ffff:127.0.0.1')).to.contain('127.0.0.1').and.contain('loopback');
      expect(refusalReason('2002:7f00:1::')).to.contain('6to4');
      expect(refusalReason('8.8.8.8')).to.equal(null);
    });
  });

  describe('parsers', () => {
    it('parses IPv6 zero compression, embedded IPv4 tails and zone ids', () => {
      expect(parseIPv6('::')).to.deep.equal([0, 0, 0, 0, 0, 0, 0, 0]);
      expect(parseIPv6('1::')).to.deep.equal([1, 0, 0, 0, 0, 0, 0, 0]);
      expect(parseIPv6('1:2::7:8')).to.deep.equal([1, 2, 0, 0, 0, 0, 7, 8]);
      expect(parseIPv6('::ffff:1.2.3.4')).to.deep.equal([0, 0, 0, 0, 0, 0xffff, 0x0102, 0x0304]);
      expect(parseIPv6('1:2:3:4:5:6:1.2.3.4')).to.deep.equal([1, 2, 3, 4, 5, 6, 0x0102, 0x0304]);
      expect(parseIPv6('fe80::1%25eth0')).to.deep.equal([0xfe80, 0, 0, 0, 0, 0, 0, 1]);
      for (const bad of ['1:2:3:4:5:6:7', '1:2:3:4:5:6:7:8::', ':::', '1.2.3.4::', '::01.2.3.4', '12345::1', 'g::1']) {
        expect(parseIPv6(bad), bad).to.equal(null);
      }
    });

    it('parses IPv4 in the forms a resolver accepts', () => {
      expect(parseIPv4('127.0.0.1')).to.equal(0x7f000001);
      expect(parseIPv4('127.1')).to.equal(0x7f000001);
      expect(parseIPv4('0x7f000001')).to.equal(0x7f000001);
      expect(parseIPv4('0177.0.0.1')).to.equal(0x7f000001);
      expect(parseIPv4('10.1.2.3.')).to.equal(0x0a010203);
      for (const bad of ['1.2.3.256', '08.1.1.1', '1.2.3.4.5', 'a.b.c.d', '', '4294967296']) {
        expect(parseIPv4(bad), bad).to.equal(null);
      }
    });
  });

  describe('checkHostAllowed', () => {
    const fakeLookup = (table: Record<string, string[]>) => {
      const calls: string[] = [];
      const fn = async (host: string, options: { all: true }): Promise<LookupAddress[]> => {
        expect(options.all).to.equal(true);
        calls.push(host);
        const addrs = table[host];
        if (addrs === undefined) throw Object.assign(new Error('not found'), { code: 'ENOTFOUND' });
        return addrs.map((address) => ({ address, family: address.includes(':') ? 6 : 4 }));
      };
      return { fn, calls };
    };

    it('judges literal addresses without a lookup', async () => {
      const { fn, calls } = fakeLookup({});
      expect(await checkHostAllowed('8.8.8.8', fn)).to.deep.equal({ ok: true, addresses: ['8.8.8.8'] });
      expect(await checkHostAllowed('[2606:4700::1111]', fn)).to.deep.equal({ ok: true, addresses: ['2606:4700::1111'] });
      expect((await checkHostAllowed('127.0.0.1', fn)).ok).to.equal(false);
      expect((await checkHostAllowed('[::1]', fn)).ok).to.equal(false);
      expect((await checkHostAllowed('[::ffff:10.0.0.1]', fn)).ok).to.equal(false);
      expect((await checkHostAllowed('2130706433', fn)).ok).to.equal(false);
      expect(calls).to.deep.equal([]);
    });

    it('refuses localhost names without asking the resolver', async () => {
      const { fn, calls } = fakeLookup({ localhost: ['8.8.8.8'] });
      for (const h of ['localhost', 'LOCALHOST', 'localhost.', 'api.localhost']) {
        const v = await checkHostAllowed(h, fn);
        expect(v.ok, h).to.equal(false);
      }
      expect(calls).to.deep.equal([]);
    });

    it('refuses a name that resolves to a refused address, even among public ones', async () => {
      const { fn } = fakeLookup({
        'evil.example': ['127.0.0.1'],
        'mixed.example': ['8.8.8.8', '::ffff:192.168.0.1'],
        'public.example': ['1.1.1.1', '2606:4700::1111'],
      });
      const evil = await checkHostAllowed('evil.example', fn);
      expect(evil.ok).to.equal(false);
      if (!evil.ok) expect(evil.reason).to.contain('127.0.0.1');
      expect((await checkHostAllowed('mixed.example', fn)).ok).to.equal(false);
      expect(await checkHostAllowed('public.example', fn)).to.deep.equal({ ok: true, addresses: ['1.1.1.1', '2606:4700::1111'] });
    });

    it('refuses a name that does not resolve, or resolves to nothing', async () => {
      const { fn } = fakeLookup({ 'empty.example': [] });
      const missing = await checkHostAllowed('missing.example', fn);
      expect(missing.ok).to.equal(false);
      if (!missing.ok) expect(missing.reason).to.contain('ENOTFOUND');
      expect((await checkHostAllowed('empty.example', fn)).ok).to.equal(false);
      expect((await checkHostAllowed('', fn)).ok).to.equal(false);
    });
  });

  describe('policyLookup', () => {
    const fakeBase = (table: Record<string, string[]>): LookupFunction =>
      (hostname, options, cb) => {
        const addrs = (table[hostname] ?? []).map((address) => ({ address, family: address.includes(':') ? 6 : 4 }));
        setImmediate(() => {
          if (addrs.length === 0) cb(Object.assign(new Error('nope'), { code: 'ENOTFOUND' }), '');
          else if (options.all) cb(null, addrs);
          else cb(null, addrs[0].address, addrs[0].family);
        });
      };
    const base = fakeBase({
      'evil.example': ['127.0.0.1'],
      'rebind.example': ['8.8.8.8', '10.0.0.5'],
      'public.example': ['1.1.1.1', '2606:4700::1111'],
    });
    const call = (lookup: LookupFunction, host: string, options: LookupOptions) =>
      new Promise<{ err: NodeJS.ErrnoException | null; address: unknown; family?: number }>((resolve) =>
        lookup(host, options, (err, address, family) => resolve({ err, address, family })));

    it('refuses with SARSEN_HOST_REFUSED when any address is refused', async () => {
      const lookup = policyLookup(base);
      for (const host of ['evil.example', 'rebind.example']) {
        for (const all of [true, false]) {
          const { err } = await call(lookup, host, { all });
          expect(err, host).to.be.instanceOf(Error);
          expect(err?.code).to.equal(HOST_REFUSED_CODE);
        }
      }
    });

    it('passes public answers through in the shape asked for', async () => {
      const lookup = policyLookup(base);
      const all = await call(lookup, 'public.example', { all: true });
      expect(all.err).to.equal(null);
      expect(all.address).to.deep.equal([{ address: '1.1.1.1', family: 4 }, { address: '2606:4700::1111', family: 6 }]);
      const one = await call(lookup, 'public.example', { family: 0 });
      expect(one.err).to.equal(null);
      expect(one.address).to.equal('1.1.1.1');
      expect(one.family).to.equal(4);
    });

    it('passes resolver errors through', async () => {
      const { err } = await call(policyLookup(base), 'missing.example', { all: true });
      expect(err?.code).to.equal('ENOTFOUND');
    });

    it('checks every address even when the base lookup answers one', async () => {
      const single: LookupFunction = (_h, _o, cb) => setImmediate(() => cb(null, '::ffff:127.0.0.1', 6));
      const { err } = await call(policyLookup(single), 'x.example', {});
      expect(err?.code).to.equal(HOST_REFUSED_CODE);
    });

    it("refuses at connect time when installed as undici's connect.lookup", async () => {
      // The fake resolver answers loopback, so the refusal happens before any socket opens.
      const agent = new Agent({ connect: { lookup: policyLookup(fakeBase({ 'backend.test': ['127.0.0.1'] })) } });
      try {
        const err = await request('http://backend.test:9/', { dispatcher: agent }).then(
          () => null,
          (e: NodeJS.ErrnoException) => e,
        );
        expect(err?.code).to.equal(HOST_REFUSED_CODE);
      } finally {
        await agent.close();
      }
    });
  });
});
