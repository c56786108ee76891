// What a provider's answer tells a GenAI client span (src/core/genai.ts): id, model and finish
// reasons of each dialect, whole or streamed, and nothing of the text.
import { expect } from 'chai';
import { answerFacts, createStreamFacts, providerName } from '../../src/core/genai.ts';
import { chatCompletionBody, chatFrames, messagesBody, messagesFrames, responsesBody, responsesFrames } from '../support/fake-provider.ts';

const streamed = (dialect: 'chat' | 'messages' | 'responses', frames: string[]) => {
  const reader = createStreamFacts(dialect);
  for (const f of frames) reader.push(Buffer.from(f));
  return reader.result();
};

describe('GenAI facts of an answer', () => {
  it('reads a whole answer of each dialect', () => {
    expect(answerFacts('chat', Buffer.from(JSON.stringify(chatCompletionBody('hi', { id: 'chatcmpl-1', model: 'gpt-x', finishReason: 'length' }))))).to.deep.equal({ id: 'chatcmpl-1', model: 'gpt-x', finishReasons: ['length'] });
    expect(answerFacts('messages', Buffer.from(JSON.stringify(messagesBody('hi', { id: 'msg_1', model: 'claude-x' }))))).to.deep.equal({ id: 'msg_1', model: 'claude-x', finishReasons: ['end_turn'] });
    expect(answerFacts('responses', Buffer.from(JSON.stringify(responsesBody('hi', { id: 'resp_1', model: 'gpt-r' }))))).to.deep.equal({ id: 'resp_1', model: 'gpt-r', finishReasons: ['completed'] });
  });

  it('reads a stream of each dialect from the frames that carry the facts', () => {
    expect(streamed('chat', chatFrames(['a', 'b'], { id: 'chatcmpl-2', model: 'gpt-y', usage: true }))).to.deep.equal({ id: 'chatcmpl-2', model: 'gpt-y', finishReasons: ['stop'] });
    expect(streamed('messages', messagesFrames(['a', 'b'], { id: 'msg_2', model: 'claude-y', stopReason: 'max_tokens' }))).to.deep.equal({ id: 'msg_2', model: 'claude-y', finishReasons: ['max_tokens'] });
    expect(streamed('responses', responsesFrames(['a', 'b'], { id: 'resp_2', model: 'gpt-s' }))).to.deep.equal({ id: 'resp_2', model: 'gpt-s', finishReasons: ['completed'] });
  });

  it('takes identifiers only: a long string or a malformed answer tells nothing', () => {
    expect(answerFacts('chat', Buffer.from(JSON.stringify({ id: 'x'.repeat(500), model: 'm', choices: [{ finish_reason: 'the whole answer text '.repeat(20) }] })))).to.deep.equal({ id: null, model: 'm', finishReasons: [] });
    expect(answerFacts('chat', Buffer.from('<html>bad gateway</html>'))).to.deep.equal({ id: null, model: null, finishReasons: [] });
    expect(streamed('chat', ['data: {not json\n\n', 'data: [DONE]\n\n'])).to.deep.equal({ id: null, model: null, finishReasons: [] });
  });

  it('names the provider by the API its backend speaks', () => {
    expect(providerName('chat')).to.equal('openai');
    expect(providerName('messages')).to.equal('anthropic');
  });
});
