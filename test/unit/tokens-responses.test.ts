// Token counts of the responses dialect: `usage` of the answer, and of a stream's terminal
// event (response.completed, also response.incomplete and response.failed), on the fake
// provider's own frames (the vendor's event shapes).
import { expect } from 'chai';
import { createFramer } from '../../src/core/sse-framer.ts';
import { createStreamTokenReader, tokensFromAnswer, type Tokens } from '../../src/core/tokens.ts';
import { responsesBody, responsesFrames } from '../support/fake-provider.ts';

function readStream(stream: string): Tokens {
  const framer = createFramer();
  const reader = createStreamTokenReader('responses');
  for (const frame of [...framer.push(Buffer.from(stream)), ...framer.end()]) reader.push(frame);
  return reader.result();
}

describe('tokens (responses)', () => {
  it('reads input, output and total tokens from the answer', () => {
    const body = JSON.stringify(responsesBody('hello there', { inputTokens: 12, outputTokens: 2 }));
    expect(tokensFromAnswer('responses', body)).to.deep.equal({ prompt: 12, completion: 2, total: 14 });
  });

  it('keeps the provider total, derives a missing one, and leaves an unknown part unknown', () => {
    expect(tokensFromAnswer('responses', '{"usage":{"input_tokens":3,"output_tokens":4,"total_tokens":9}}').total).to.equal(9);
    expect(tokensFromAnswer('responses', '{"usage":{"input_tokens":3,"output_tokens":4}}')).to.deep.equal({ prompt: 3, completion: 4, total: 7 });
    expect(tokensFromAnswer('responses', '{"usage":{"input_tokens":3}}')).to.deep.equal({ prompt: 3, completion: null, total: null });
    expect(tokensFromAnswer('responses', '{"usage":null}')).to.deep.equal({ prompt: null, completion: null, total: null });
    // Chat's field names mean nothing in this dialect.
    expect(tokensFromAnswer('responses', '{"usage":{"prompt_tokens":3,"completion_tokens":4}}')).to.deep.equal({ prompt: null, completion: null, total: null });
  });

  it('reads a stream\'s usage from response.completed only, however the lines end', () => {
    for (const lineEnding of ['\n', '\r\n', '\r'] as const) {
      const frames = responsesFrames(['one ', 'two ', 'three'], { inputTokens: 21, outputTokens: 3, lineEnding });
      expect(readStream(frames.join('')), JSON.stringify(lineEnding)).to.deep.equal({ prompt: 21, completion: 3, total: 24 });
      // Everything before the terminal event says nothing (response.created carries usage: null).
      expect(readStream(frames.slice(0, -1).join(''))).to.deep.equal({ prompt: null, completion: null, total: null });
    }
  });

  it('also counts the usage of a response that ended incomplete or failed', () => {
    expect(readStream(responsesFrames(['a'], { inputTokens: 5, outputTokens: 1, end: 'incomplete' }).join(''))).to.deep.equal({ prompt: 5, completion: 1, total: 6 });
    expect(readStream(responsesFrames(['a'], { inputTokens: 5, outputTokens: 1, end: 'failed' }).join(''))).to.deep.equal({ prompt: 5, completion: 1, total: 6 });
  });

  it('ignores usage-shaped text in other events (a delta that says "usage")', () => {
    const frames = responsesFrames(['"usage":{"input_tokens":99}'], { inputTokens: 4, outputTokens: 1 });
    expect(readStream(frames.join(''))).to.deep.equal({ prompt: 4, completion: 1, total: 5 });
  });
});
