import { expect } from 'chai';
import { parseCacheHeader, cachePolicy, cacheKey, isProviderFailureFrame, isStreamEndFrame } from '../../src/core/response-cache.ts';
import type { Dialect } from '../../src/core/dialects.ts';
import { createFramer } from '../../src/core/sse-framer.ts';
import { chatFrames, messagesFrames, responsesFrames } from '../support/fake-provider.ts';

/** The frames of a stream, split as the executor splits them. */
const framed = (frames: string[]): Buffer[] => {
  const framer = createFramer();
  return [...framer.push(Buffer.from(frames.join(''))), ...framer.end()];
};
/** The frames of a stream that are its dialect's last event. */
const ends = (dialect: Dialect, frames: string[]) => framed(frames).filter((f) => isStreamEndFrame(dialect, f)).map((f) => f.toString('utf8'));
const failures = (frames: string[]) => framed(frames).filter(isProviderFailureFrame).map((f) => f.toString('utf8'));

describe('response cache: header, policy, key and servable streams', () => {
  it('reads one directive, case and blanks aside; anything else is named as refused', () => {
    expect(parseCacheHeader(undefined)).to.deep.equal({ kind: 'default' });
    expect(parseCacheHeader(' No-Store ')).to.deep.equal({ kind: 'no-store' });
    expect(parseCacheHeader('max-age=0')).to.deep.equal({ kind: 'max-age', seconds: 0 });
    expect(parseCacheHeader('MAX-AGE=90')).to.deep.equal({ kind: 'max-age', seconds: 90 });
    for (const bad of ['', 'no-cache', 'max-age=-1', 'max-age=1.5', 'max-age=', 'max-age=5, no-store', ['no-store', 'max-age=5'], 'max-age=12345678901']) {
      expect(parseCacheHeader(bad), JSON.stringify(bad)).to.be.a('string');
    }
  });

  it('max-age shortens the namespace\'s life and never lengthens it; no-store reads nothing and keeps nothing; no namespace cache, no policy', () => {
    expect(cachePolicy(null, { kind: 'max-age', seconds: 60 })).to.equal(null);
    expect(cachePolicy(5, { kind: 'default' })).to.deep.equal({ lifeMs: 300_000, store: true });
    expect(cachePolicy(5, { kind: 'max-age', seconds: 30 })).to.deep.equal({ lifeMs: 30_000, store: true });
    expect(cachePolicy(5, { kind: 'max-age', seconds: 3600 })).to.deep.equal({ lifeMs: 300_000, store: true });
    expect(cachePolicy(5, { kind: 'no-store' })).to.deep.equal({ lifeMs: 0, store: false });
  });

  it('the key depends on the identity, the resolved backend and the model sent, and on nothing else', () => {
    const id = Buffer.alloc(32, 1);
    const k = cacheKey(id, 'bk_1', 'gpt-x');
    expect(k).to.have.length(32);
    expect(cacheKey(Buffer.alloc(32, 1), 'bk_1', 'gpt-x').equals(k)).to.equal(true);
    expect(cacheKey(Buffer.alloc(32, 2), 'bk_1', 'gpt-x').equals(k)).to.equal(false);
    expect(cacheKey(id, 'bk_2', 'gpt-x').equals(k)).to.equal(false);
    expect(cacheKey(id, 'bk_1', 'gpt-y').equals(k)).to.equal(false);
    // The separator keeps a backend id and a model from running into each other.
    expect(cacheKey(id, 'bk_1g', 'pt-x').equals(k)).to.equal(false);
  });

  it('a frame is a provider failure when its event or data type says so, or its data carries an error; nothing else is', () => {
    // Whole answers in every dialect, also one cut short by its token limit: no failure anywhere.
    for (const le of ['\n', '\r\n'] as const) {
      expect(failures(chatFrames(['an error ', 'message', ' failed'], { usage: true, lineEnding: le }))).to.deep.equal([]);
      expect(failures(chatFrames(['cut'], { finishReason: 'length', lineEnding: le }))).to.deep.equal([]);
      expect(failures(messagesFrames(['error', ' failed'], { lineEnding: le }))).to.deep.equal([]);
      expect(failures(responsesFrames(['error: ', 'failed'], { lineEnding: le }))).to.deep.equal([]);
      expect(failures(responsesFrames(['cut short'], { end: 'incomplete', lineEnding: le }))).to.deep.equal([]);
    }
    // The Responses API's failed response: its terminal event.
    const failed = responsesFrames(['half'], { end: 'failed' });
    expect(failures(failed)).to.deep.equal([failed.at(-1)]);
    // Its error event, by name or by its data's type alone; `response.error` alike.
    const responsesError = 'event: error\ndata: {"type":"error","code":"server_error","message":"boom","param":null,"sequence_number":3}\n\n';
    expect(failures([responsesError])).to.deep.equal([responsesError]);
    expect(failures(['data: {"type":"error","code":null,"message":"boom"}\n\n'])).to.have.length(1);
    expect(failures(['data: {"type":"response.failed","response":{}}\n\n'])).to.have.length(1);
    expect(failures(['event: response.error\ndata: {}\n\n'])).to.have.length(1);
    // A messages provider's error event.
    const overloaded = 'event: error\r\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\r\n\r\n';
    expect(failures([...messagesFrames(['half']).slice(0, 3), overloaded])).to.deep.equal([overloaded]);
    // A chat provider's error, a data frame with an `error` object (no event name), then [DONE].
    const chatError = 'data: {"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}\n\n';
    expect(failures([...chatFrames(['half']).slice(0, 2), chatError, 'data: [DONE]\n\n'])).to.deep.equal([chatError]);
    // An error member that says nothing, and text that merely names one, are not failures.
    expect(failures(['data: {"error":null,"x":"failed"}\n\n', 'data: error failed\n\n', ': error\n\n'])).to.deep.equal([]);
  });

  it('finds the last event of each dialect, whatever the line endings, and nowhere else', () => {
    for (const lineEnding of ['\n', '\r\n', '\r'] as const) {
      const chat = chatFrames(['a [DONE] b'], { lineEnding });
      expect(ends('chat', chat), lineEnding).to.deep.equal([chat.at(-1)]);
      const messages = messagesFrames(['message_stop'], { lineEnding });
      expect(ends('messages', messages), lineEnding).to.deep.equal([messages.find((f) => f.startsWith('event: message_stop'))]);
      for (const end of ['completed', 'incomplete'] as const) {
        const responses = responsesFrames(['response.completed'], { end, lineEnding });
        expect(ends('responses', responses), `${end} ${lineEnding}`).to.deep.equal([responses.at(-1)]);
      }
    }
    // Cut short: no last event. A failed response is no whole answer either.
    expect(ends('chat', chatFrames(['half']).slice(0, -1))).to.deep.equal([]);
    expect(ends('messages', messagesFrames(['half']).filter((f) => !f.includes('message_stop')))).to.deep.equal([]);
    expect(ends('responses', responsesFrames(['half'], { end: 'failed' }))).to.deep.equal([]);
    // Named only in its data's type, as a provider that sends no event lines would.
    expect(ends('messages', ['data: {"type":"message_stop"}\n\n'])).to.have.length(1);
    expect(ends('responses', ['data: {"type":"response.completed","response":{}}\n\n'])).to.have.length(1);
    // Another dialect's end, a comment or a text naming it are not this dialect's end.
    expect(ends('chat', ['event: message_stop\ndata: {"type":"message_stop"}\n\n', ': [DONE]\n\n', 'data: "[DONE]"\n\n'])).to.deep.equal([]);
    expect(ends('messages', ['data: [DONE]\n\n', 'data: {"type":"content_block_delta","delta":{"text":"message_stop"}}\n\n'])).to.deep.equal([]);
  });
});
