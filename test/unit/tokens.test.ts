import { expect } from 'chai';
import { createFramer } from '../../src/core/sse-framer.ts';
import { createStreamTokenReader, tokensFromAnswer } from '../../src/core/tokens.ts';
import type { Dialect, Tokens } from '../../src/core/tokens.ts';

const UNKNOWN: Tokens = { prompt: null, completion: null, total: null };

/** Runs a whole stream text through the framer and a reader. */
function readStream(dialect: Dialect, stream: string): Tokens {
  const framer = createFramer();
  const reader = createStreamTokenReader(dialect);
  for (const frame of [...framer.push(Buffer.from(stream)), ...framer.end()]) reader.push(frame);
  return reader.result();
}

const chatChunk = (extra: object): string =>
  `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [], ...extra })}\n\n`;
const msgEvent = (type: string, body: object): string => `event: ${type}\ndata: ${JSON.stringify({ type, ...body })}\n\n`;

describe('tokens', () => {
  describe('tokensFromAnswer (chat)', () => {
    it('reads prompt, completion and total', () => {
      const body = JSON.stringify({ id: 'x', choices: [], usage: { prompt_tokens: 11, completion_tokens: 7, total_tokens: 18 } });
      expect(tokensFromAnswer('chat', body)).to.deep.equal({ prompt: 11, completion: 7, total: 18 });
      expect(tokensFromAnswer('chat', Buffer.from(body))).to.deep.equal({ prompt: 11, completion: 7, total: 18 });
    });

    it('keeps the provider total even when it differs from the sum', () => {
      const body = JSON.stringify({ usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 9 } });
      expect(tokensFromAnswer('chat', body).total).to.equal(9);
    });

    it('derives the total when the provider omits it, and leaves it unknown when a part is unknown', () => {
      expect(tokensFromAnswer('chat', '{"usage":{"prompt_tokens":3,"completion_tokens":4}}')).to.deep.equal({
        prompt: 3,
        completion: 4,
        total: 7,
      });
      expect(tokensFromAnswer('chat', '{"usage":{"prompt_tokens":3}}')).to.deep.equal({ prompt: 3, completion: null, total: null });
    });

    it('reports zeros as zeros and missing usage as unknown', () => {
      expect(tokensFromAnswer('chat', '{"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}')).to.deep.equal({
        prompt: 0,
        completion: 0,
        total: 0,
      });
      expect(tokensFromAnswer('chat', '{"choices":[]}')).to.deep.equal(UNKNOWN);
      expect(tokensFromAnswer('chat', '{"usage":null}')).to.deep.equal(UNKNOWN);
    });

    it('ignores malformed JSON and implausible counts without throwing', () => {
      for (const body of ['', 'not json', '{"usage":', '[1,2]', 'null', '"usage"']) {
        expect(tokensFromAnswer('chat', body), body).to.deep.equal(UNKNOWN);
      }
      expect(tokensFromAnswer('chat', '{"usage":{"prompt_tokens":-1,"completion_tokens":"5","total_tokens":1.5}}')).to.deep.equal(UNKNOWN);
    });
  });

  describe('tokensFromAnswer (messages)', () => {
    it('adds cache tokens to the prompt', () => {
      const body = JSON.stringify({
        type: 'message',
        usage: { input_tokens: 10, cache_creation_input_tokens: 100, cache_read_input_tokens: 1000, output_tokens: 5 },
      });
      expect(tokensFromAnswer('messages', body)).to.deep.equal({ prompt: 1110, completion: 5, total: 1115 });
    });

    it('counts missing or null cache fields as 0', () => {
      expect(tokensFromAnswer('messages', '{"usage":{"input_tokens":10,"output_tokens":5}}')).to.deep.equal({
        prompt: 10,
        completion: 5,
        total: 15,
      });
      expect(
        tokensFromAnswer('messages', '{"usage":{"input_tokens":10,"cache_read_input_tokens":null,"output_tokens":5}}'),
      ).to.deep.equal({ prompt: 10, completion: 5, total: 15 });
    });

    it('leaves the prompt unknown without input_tokens, whatever the cache fields say', () => {
      expect(tokensFromAnswer('messages', '{"usage":{"cache_read_input_tokens":50,"output_tokens":5}}')).to.deep.equal({
        prompt: null,
        completion: 5,
        total: null,
      });
    });

    it('reports zeros as zeros and missing usage as unknown', () => {
      expect(tokensFromAnswer('messages', '{"usage":{"input_tokens":0,"output_tokens":0}}')).to.deep.equal({
        prompt: 0,
        completion: 0,
        total: 0,
      });
      expect(tokensFromAnswer('messages', '{"type":"error","error":{"type":"overloaded_error"}}')).to.deep.equal(UNKNOWN);
      expect(tokensFromAnswer('messages', '{oops')).to.deep.equal(UNKNOWN);
    });
  });

  describe('createStreamTokenReader (chat)', () => {
    it('reads the final usage chunk', () => {
      const stream =
        chatChunk({ choices: [{ index: 0, delta: { content: 'usage is a word' } }], usage: null }) +
        chatChunk({ choices: [{ index: 0, delta: {}, finish_reason: 'stop' }], usage: null }) +
        chatChunk({ usage: { prompt_tokens: 12, completion_tokens: 30, total_tokens: 42 } }) +
        'data: [DONE]\n\n';
      expect(readStream('chat', stream)).to.deep.equal({ prompt: 12, completion: 30, total: 42 });
    });

    it('lets later usage objects override earlier ones field by field', () => {
      const stream =
        chatChunk({ usage: { prompt_tokens: 12, completion_tokens: 1, total_tokens: 13 } }) +
        chatChunk({ usage: { completion_tokens: 9 } });
      expect(readStream('chat', stream)).to.deep.equal({ prompt: 12, completion: 9, total: 13 });
    });

    it('reports unknown when no chunk carried usage, and zeros as zeros', () => {
      expect(readStream('chat', chatChunk({ choices: [{ delta: { content: 'hi' } }] }) + 'data: [DONE]\n\n')).to.deep.equal(UNKNOWN);
      expect(readStream('chat', chatChunk({ usage: { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 } }))).to.deep.equal({
        prompt: 0,
        completion: 0,
        total: 0,
      });
    });

    it('ignores malformed and non-JSON frames without throwing', () => {
      const stream =
        ': ping\n\n' +
        'data: {"usage": {"prompt_tokens": 1\n\n' +
        'data: usage\n\n' +
        '\n' +
        chatChunk({ usage: { prompt_tokens: 2, completion_tokens: 3, total_tokens: 5 } }) +
        'data: {"usage": [\n\n';
      expect(readStream('chat', stream)).to.deep.equal({ prompt: 2, completion: 3, total: 5 });
    });

    it('reads usage split over multi-line data and CRLF endings', () => {
      const stream = 'data: {"usage":\r\ndata: {"prompt_tokens":4,"completion_tokens":6}}\r\n\r\n';
      expect(readStream('chat', stream)).to.deep.equal({ prompt: 4, completion: 6, total: 10 });
    });
  });

  describe('createStreamTokenReader (messages)', () => {
    const start = (usage: object): string =>
      msgEvent('message_start', { message: { id: 'msg_1', type: 'message', role: 'assistant', content: [], usage } });

    it('combines message_start input usage with message_delta output usage', () => {
      const stream =
        start({ input_tokens: 25, cache_creation_input_tokens: 5, cache_read_input_tokens: 70, output_tokens: 1 }) +
        msgEvent('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }) +
        msgEvent('ping', {}) +
        msgEvent('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'the usage was' } }) +
        msgEvent('content_block_stop', { index: 0 }) +
        msgEvent('message_delta', { delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 15 } }) +
        msgEvent('message_stop', {});
      expect(readStream('messages', stream)).to.deep.equal({ prompt: 100, completion: 15, total: 115 });
    });

    it('lets message_delta override input and cache counts, but not with null', () => {
      const stream =
        start({ input_tokens: 25, cache_read_input_tokens: 70, output_tokens: 1 }) +
        msgEvent('message_delta', {
          delta: {},
          usage: { input_tokens: 30, cache_creation_input_tokens: null, cache_read_input_tokens: 80, output_tokens: 9 },
        });
      expect(readStream('messages', stream)).to.deep.equal({ prompt: 110, completion: 9, total: 119 });
    });

    it('keeps the prompt known and the completion unknown when the stream stops early', () => {
      const s = readStream('messages', start({ input_tokens: 25 }) + msgEvent('content_block_start', { index: 0 }));
      expect(s).to.deep.equal({ prompt: 25, completion: null, total: null });
    });

    it('ignores usage on other event types', () => {
      const stream = msgEvent('content_block_delta', { usage: { input_tokens: 5, output_tokens: 5 } });
      expect(readStream('messages', stream)).to.deep.equal(UNKNOWN);
    });

    it('reports zeros as zeros, nothing as unknown, and survives malformed frames', () => {
      expect(readStream('messages', start({ input_tokens: 0, output_tokens: 0 }))).to.deep.equal({ prompt: 0, completion: 0, total: 0 });
      expect(readStream('messages', '')).to.deep.equal(UNKNOWN);
      const stream =
        'event: message_start\ndata: {"type":"message_start","message":{"usage":\n\n' +
        'event: message_delta\ndata: {"type":"message_delta","usage":"lots"}\n\n' +
        msgEvent('error', { error: { type: 'overloaded_error', message: 'usage high' } });
      expect(readStream('messages', stream)).to.deep.equal(UNKNOWN);
    });
  });
});
