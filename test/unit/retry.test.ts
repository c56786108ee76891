import { expect } from 'chai';
import { RETRY_AFTER_CEILING_MS, isRetryableStatus, nextDelayMs, parseHttpDate, parseRetryAfter } from '../../src/core/retry.ts';

const NOW = Date.UTC(2025, 5, 15, 12, 0, 0); // Sun, 15 Jun 2025 12:00:00 GMT

describe('retry', () => {
  describe('isRetryableStatus', () => {
    it('retries 408, 429, 500, 502, 503, 504 and 529', () => {
      for (const s of [408, 429, 500, 502, 503, 504, 529]) expect(isRetryableStatus(s), String(s)).to.equal(true);
    });

    it('treats every other status as a refusal', () => {
      for (const s of [200, 201, 301, 400, 401, 403, 404, 409, 413, 422, 499, 501, 505, 520, 530, 0, -1]) {
        expect(isRetryableStatus(s), String(s)).to.equal(false);
      }
    });
  });

  describe('parseRetryAfter', () => {
    it('reads delta-seconds, including decimals and surrounding space', () => {
      expect(parseRetryAfter('0', NOW)).to.equal(0);
      expect(parseRetryAfter('30', NOW)).to.equal(30000);
      expect(parseRetryAfter(' 7 ', NOW)).to.equal(7000);
      expect(parseRetryAfter('1.5', NOW)).to.equal(1500);
      expect(parseRetryAfter('0.0004', NOW)).to.equal(1); // rounded up, never shorter than asked
    });

    it('reads the three HTTP-date forms relative to now', () => {
      expect(parseRetryAfter('Sun, 15 Jun 2025 12:00:45 GMT', NOW)).to.equal(45000);
      expect(parseRetryAfter('Sunday, 15-Jun-25 12:01:00 GMT', NOW)).to.equal(60000);
      expect(parseRetryAfter('Sun Jun 15 12:00:10 2025', NOW)).to.equal(10000);
      expect(parseRetryAfter('Sun Jun  1 12:00:10 2025', NOW)).to.equal(0); // past
      expect(parseRetryAfter('sun, 15 jun 2025 13:00:00 gmt', NOW)).to.equal(3600000);
    });

    it('gives 0 for a date in the past', () => {
      expect(parseRetryAfter('Sun, 06 Nov 1994 08:49:37 GMT', NOW)).to.equal(0);
    });

    it('returns null for absent or unreadable values', () => {
      for (const v of [undefined, '', 'soon', '-5', '+5', '1e3', '5s', '.5', '5.', 'NaN', 'Infinity', '1, 2',
        'Sun, 31 Feb 2025 12:00:00 GMT', 'Sun, 15 Jun 2025 24:00:00 GMT', 'Sun, 15 Jun 2025 12:00:00 UTC',
        '2025-06-15T12:00:45Z', 'Sun, 15 Foo 2025 12:00:00 GMT']) {
        expect(parseRetryAfter(v, NOW), String(v)).to.equal(null);
      }
      expect(parseRetryAfter('9'.repeat(400), NOW)).to.equal(null);
    });
  });

  describe('parseHttpDate', () => {
    it('agrees with Date for IMF-fixdate', () => {
      const s = 'Wed, 09 Jun 2021 10:18:14 GMT';
      expect(parseHttpDate(s, NOW)).to.equal(Date.parse(s));
    });

    it('places two-digit RFC 850 years within 50 years of now', () => {
      expect(parseHttpDate('Sunday, 06-Nov-94 08:49:37 GMT', NOW)).to.equal(Date.UTC(1994, 10, 6, 8, 49, 37));
      expect(parseHttpDate('Monday, 06-Nov-30 08:49:37 GMT', NOW)).to.equal(Date.UTC(2030, 10, 6, 8, 49, 37));
    });

    it('reads asctime as GMT, with a space-padded day', () => {
      expect(parseHttpDate('Sun Nov  6 08:49:37 1994', NOW)).to.equal(Date.UTC(1994, 10, 6, 8, 49, 37));
    });

    it('accepts 29 Feb only in leap years', () => {
      expect(parseHttpDate('Thu, 29 Feb 2024 00:00:00 GMT', NOW)).to.equal(Date.UTC(2024, 1, 29));
      expect(parseHttpDate('Sat, 29 Feb 2025 00:00:00 GMT', NOW)).to.equal(null);
    });
  });

  describe('nextDelayMs', () => {
    const at = (r: number) => () => r;

    it('doubles the ceiling per attempt and jitters within its upper half', () => {
      const base = { baseMs: 1000, maxMs: 60000, retryAfterMs: null };
      expect(nextDelayMs({ ...base, attempt: 1, random: at(0) })).to.equal(500);
      expect(nextDelayMs({ ...base, attempt: 1, random: at(0.999999) })).to.equal(999);
      expect(nextDelayMs({ ...base, attempt: 2, random: at(0) })).to.equal(1000);
      expect(nextDelayMs({ ...base, attempt: 3, random: at(0.5) })).to.equal(3000);
      expect(nextDelayMs({ ...base, attempt: 4, random: at(0) })).to.equal(4000);
    });

    it('caps the backoff at maxMs', () => {
      const base = { baseMs: 1000, maxMs: 60000, retryAfterMs: null };
      expect(nextDelayMs({ ...base, attempt: 10, random: at(0.999999) })).to.be.at.most(60000).and.at.least(59999);
      expect(nextDelayMs({ ...base, attempt: 2000, random: at(0) })).to.equal(30000);
    });

    it('stays within [ceiling/2, ceiling] for random picks', () => {
      for (let attempt = 1; attempt <= 12; attempt++) {
        const ceiling = Math.min(60000, 1000 * 2 ** (attempt - 1));
        for (let i = 0; i < 200; i++) {
          const d = nextDelayMs({ attempt, baseMs: 1000, maxMs: 60000, retryAfterMs: null });
          expect(d).to.be.at.least(Math.floor(ceiling / 2)).and.at.most(ceiling);
        }
      }
    });

    it('waits at least the provider’s retry-after', () => {
      const base = { attempt: 1, baseMs: 1000, maxMs: 60000, random: at(0) };
      expect(nextDelayMs({ ...base, retryAfterMs: 20000 })).to.equal(20000);
      expect(nextDelayMs({ ...base, retryAfterMs: 100 })).to.equal(500); // backoff is longer
      expect(nextDelayMs({ ...base, retryAfterMs: 0 })).to.equal(500);
    });

    it('honours retry-after above maxMs, up to the one-hour ceiling', () => {
      const base = { attempt: 1, baseMs: 1000, maxMs: 60000, random: at(0) };
      expect(nextDelayMs({ ...base, retryAfterMs: 120000 })).to.equal(120000);
      expect(RETRY_AFTER_CEILING_MS).to.equal(3600000);
      expect(nextDelayMs({ ...base, retryAfterMs: 86400000 })).to.equal(RETRY_AFTER_CEILING_MS);
    });

    it('treats nonsensical inputs as the first attempt with no wait below zero', () => {
      expect(nextDelayMs({ attempt: 0, baseMs: 1000, maxMs: 60000, retryAfterMs: null, random: at(0) })).to.equal(500);
      expect(nextDelayMs({ attempt: NaN, baseMs: 1000, maxMs: 60000, retryAfterMs: null, random: at(0) })).to.equal(500);
      expect(nextDelayMs({ attempt: 3, baseMs: 0, maxMs: 60000, retryAfterMs: null, random: at(0.5) })).to.equal(0);
      expect(nextDelayMs({ attempt: 3, baseMs: 5000, maxMs: 2000, retryAfterMs: null, random: at(0) })).to.equal(1000);
    });
  });
});
