import { expect } from 'chai';
import {
  ANTHROPIC_VERSION,
  forwardableHeaders,
  isForwardableValue,
  parseHops,
  upstreamHeaders,
} from '../../src/core/header-policy.ts';

const raw = (pairs: [string, string][]): string[] => pairs.flat();

describe('header-policy', () => {
  describe('forwardableHeaders', () => {
    const incoming: [string, string][] = [
      ['Host', 'localhost:8080'],
      ['Authorization', 'Bearer sk-abc'],
      ['X-Api-Key', 'sk-ant-123'],
      ['X-Sarsen-Key', 'sar_abcdefgh_secret'],
      ['Last-Event-ID', '12'],
      ['Cookie', 'a=b'],
      ['Content-Length', '42'],
      ['Content-Type', 'application/json'],
      ['X-Claude-Code-Session-Id', 's1'],
      ['X-Sarsen-Hops', '2'],
      ['Anthropic-Version', '2099-01-01'],
      ['Anthropic-Beta', 'tools-2024-04-04'],
      ['anthropic-dangerous-direct-browser-access', 'true'],
      ['OpenAI-Beta', 'assistants=v2'],
      ['OpenAI-Organization', 'org-1'],
      ['OpenAI-Project', 'proj-1'],
      ['OpenAI-Something-Else', 'x'],
      ['anthropic-beta', 'prompt-caching-2024-07-31'],
    ];

    it('never forwards the caller\'s trace context (traceparent, tracestate, baggage): Sarsen\'s own spans carry it (docs/operations.md "Tracing")', () => {
      const traced = raw([
        ['traceparent', '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'],
        ['tracestate', 'vendor=opaque'],
        ['baggage', 'user=alice'],
        ['anthropic-beta', 'tools-2024-04-04'],
      ]);
      for (const dialect of ['chat', 'messages', 'responses'] as const) {
        expect(forwardableHeaders(dialect, traced)).to.deep.equal([['anthropic-beta', 'tools-2024-04-04']]);
      }
    });

    it('keeps the vendor-prefix and the three chat-vendor headers, lower-cased, in order, repeats included', () => {
      const expected: [string, string][] = [
        ['anthropic-beta', 'tools-2024-04-04'],
        ['anthropic-dangerous-direct-browser-access', 'true'],
        ['openai-beta', 'assistants=v2'],
        ['openai-organization', 'org-1'],
        ['openai-project', 'proj-1'],
        ['anthropic-beta', 'prompt-caching-2024-07-31'],
      ];
      expect(forwardableHeaders('messages', raw(incoming))).to.deep.equal(expected);
    });

    it('forwards the same set for both dialects', () => {
      expect(forwardableHeaders('chat', raw(incoming))).to.deep.equal(forwardableHeaders('messages', raw(incoming)));
    });

    it('never forwards the provider-version header, credentials or the service key', () => {
      const names = forwardableHeaders('messages', raw(incoming)).map(([n]) => n);
      for (const banned of ['anthropic-version', 'authorization', 'x-api-key', 'x-sarsen-key', 'last-event-id', 'x-sarsen-hops']) {
        expect(names).to.not.include(banned);
      }
    });

    it('drops values over 4,096 bytes, counting the bytes that arrived (node hands each byte over as one latin1 character)', () => {
      const ok = 'a'.repeat(4096);
      const wire = (text: string) => Buffer.from(text, 'utf8').toString('latin1'); // what node's parser gives
      const got = forwardableHeaders('messages', raw([
        ['anthropic-a', ok],
        ['anthropic-b', ok + 'a'],
        ['anthropic-c', wire('é'.repeat(2049))], // 4,098 bytes
        ['anthropic-d', wire('é'.repeat(2048))], // 4,096 bytes
        ['anthropic-e', wire('é'.repeat(1025))], // 2,050 bytes: a UTF-8 count of the latin1 string said 4,100
      ]));
      expect(got.map(([n]) => n)).to.deep.equal(['anthropic-a', 'anthropic-d', 'anthropic-e']);
      expect(got[0][1]).to.equal(ok); // kept whole, not truncated
      expect(Buffer.from(got[2][1], 'latin1')).to.deep.equal(Buffer.from('é'.repeat(1025), 'utf8')); // the same bytes
    });

    it('drops a value holding a character that cannot have come off the wire (above U+00FF)', () => {
      expect(forwardableHeaders('chat', raw([['anthropic-a', 'caf\u00e9'], ['anthropic-b', '\u20ac']]))).to.deep.equal([['anthropic-a', 'caf\u00e9']]);
    });

    it('drops values holding a control character', () => {
      const got = forwardableHeaders('chat', raw([
        ['anthropic-a', 'x\u0000y'],
        ['anthropic-b', 'x\ty'],
        ['anthropic-c', 'x\u001fy'],
        ['anthropic-d', 'x\u007fy'],
        ['anthropic-e', 'x\ry'],
        ['anthropic-f', 'plain value, with = signs; and spaces'],
        ['openai-beta', 'caf\u00e9'],
      ]));
      expect(got).to.deep.equal([
        ['anthropic-f', 'plain value, with = signs; and spaces'],
        ['openai-beta', 'caf\u00e9'],
      ]);
    });

    it('keeps an empty value and ignores a dangling name', () => {
      expect(forwardableHeaders('messages', ['anthropic-beta', '', 'anthropic-x'])).to.deep.equal([['anthropic-beta', '']]);
    });
  });

  describe('isForwardableValue', () => {
    it('accepts exactly 4,096 bytes and refuses 4,097', () => {
      expect(isForwardableValue('x'.repeat(4096))).to.equal(true);
      expect(isForwardableValue('x'.repeat(4097))).to.equal(false);
    });
  });

  describe('upstreamHeaders', () => {
    const base = { forwarded: [] as [string, string][], hops: 1, contentLength: 123, accept: 'application/json' };

    it('builds a chat call with a bearer credential and no provider-version header', () => {
      expect(upstreamHeaders('chat', { ...base, credential: 'sk-live' })).to.deep.equal({
        'content-type': 'application/json',
        accept: 'application/json',
        'content-length': '123',
        authorization: 'Bearer sk-live',
        'x-sarsen-hops': '1',
      });
    });

    it('builds a messages call with x-api-key and the fixed provider version', () => {
      const h = upstreamHeaders('messages', { ...base, credential: 'sk-ant-k', hops: 3, accept: 'text/event-stream' });
      expect(h).to.deep.equal({
        'content-type': 'application/json',
        accept: 'text/event-stream',
        'content-length': '123',
        'x-api-key': 'sk-ant-k',
        'anthropic-version': ANTHROPIC_VERSION,
        'x-sarsen-hops': '3',
      });
      expect(h['anthropic-version']).to.equal('2023-06-01');
    });

    it('sends no credential header when there is none', () => {
      const h = upstreamHeaders('messages', { ...base, credential: null });
      expect(h).to.not.have.property('x-api-key');
      expect(h).to.not.have.property('authorization');
    });

    it('adds forwarded headers, joining repeats, without letting them override Sarsen’s own', () => {
      const forwarded: [string, string][] = [
        ['anthropic-beta', 'a'],
        ['anthropic-version', '1999-01-01'],
        ['authorization', 'Bearer stolen'],
        ['x-sarsen-hops', '0'],
        ['content-type', 'text/plain'],
        ['openai-project', 'p'],
        ['Anthropic-Beta', 'b'],
        ['anthropic-bad', 'x\ny'],
      ];
      const h = upstreamHeaders('messages', { ...base, credential: 'k', forwarded });
      expect(h['anthropic-beta']).to.equal('a, b');
      expect(h['openai-project']).to.equal('p');
      expect(h['anthropic-version']).to.equal(ANTHROPIC_VERSION);
      expect(h['x-sarsen-hops']).to.equal('1');
      expect(h['content-type']).to.equal('application/json');
      expect(h).to.not.have.property('authorization');
      expect(h).to.not.have.property('anthropic-bad');
      const c = upstreamHeaders('chat', { ...base, credential: 'k', forwarded });
      expect(c.authorization).to.equal('Bearer k');
      expect(c).to.not.have.property('anthropic-version');
    });
  });

  describe('parseHops', () => {
    it('reads a non-negative integer', () => {
      expect(parseHops('0')).to.equal(0);
      expect(parseHops('4')).to.equal(4);
      expect(parseHops(' 12 ')).to.equal(12);
    });

    it('reads missing, empty and unreadable values as 0', () => {
      for (const v of [undefined, '', ' ', 'abc', '-3', '+3', '2.5', '1e3', 'NaN', 'Infinity', '0x10', '3 4']) {
        expect(parseHops(v), String(v)).to.equal(0);
      }
    });

    it('takes the deepest readable value of a repeated header', () => {
      expect(parseHops('2, 5, x')).to.equal(5);
      expect(parseHops(['1', '7'])).to.equal(7);
      expect(parseHops([])).to.equal(0);
    });

    it('reads an absurdly large value as over any ceiling', () => {
      expect(parseHops('9'.repeat(40))).to.equal(Number.MAX_SAFE_INTEGER);
    });
  });
});
