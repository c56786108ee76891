// Streaming through Sarsen (issue 5): the official SDKs stream unmodified, a raw caller receives
// exactly the provider's bytes whatever its line endings and read boundaries, and the record
// carries the token counts read from the frames.
import { expect } from 'chai';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatFrames, messagesFrames, defaultAnswer, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { postStream, replayStream, stripIds, withIds, bytesOf, query, requestIdByMarker } from './streaming-support.ts';

type TokenRow = { prompt_tokens: number | null; completion_tokens: number | null; total_tokens: number | null };

describe('streaming: SDKs and bytes', function () {
  this.timeout(60_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let unique = 0;
  const marker = () => `stream-sdk-${process.pid}-${++unique}`;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer();
    t = await provision(server, provider);
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });
  beforeEach(() => provider.reset());

  const tokensOf = async (m: string): Promise<TokenRow> => {
    const id = await requestIdByMarker(server.db, m);
    const [row] = await query<TokenRow>(server.db, `SELECT prompt_tokens, completion_tokens, total_tokens FROM sarsen.requests WHERE id = $1`, [id]);
    return row!;
  };

  describe('openai', () => {
    it('streams with stream: true (frames with bare \\r line endings); no usage reported means null tokens', async () => {
      const m = marker();
      provider.enqueue({ kind: 'sse', frames: chatFrames(['Hel', 'lo ', 'wor', 'ld'], { lineEnding: '\r' }), frameDelayMs: 5 });
      const client = new OpenAI({ baseURL: t.base, apiKey: t.key, maxRetries: 0 });
      const stream = await client.chat.completions.create({ model: 'gpt-test', stream: true, messages: [{ role: 'user', content: m }] });
      let text = '';
      let chunks = 0;
      for await (const chunk of stream) {
        chunks++;
        text += chunk.choices[0]?.delta?.content ?? '';
      }
      expect(text).to.equal('Hello world');
      expect(chunks).to.equal(6); // role, four pieces, finish; [DONE] ends the iteration
      expect(provider.journal).to.have.length(1);
      expect(provider.journal[0]!.json.stream).to.equal(true);
      expect(await tokensOf(m)).to.deep.equal({ prompt_tokens: null, completion_tokens: null, total_tokens: null });
    });

    it('the stream helper with stream_options.include_usage gets the usage chunk; the record has the numbers', async () => {
      const m = marker();
      const body = { model: 'gpt-test', messages: [{ role: 'user' as const, content: `count these words ${m}` }] };
      const expected = defaultAnswer(body);
      const client = new OpenAI({ baseURL: t.base, apiKey: t.key, maxRetries: 0 });
      const runner = client.chat.completions.stream({ ...body, stream_options: { include_usage: true } });
      const deltas: string[] = [];
      runner.on('content', (delta) => deltas.push(delta));
      const final = await runner.finalChatCompletion();
      expect(final.choices[0]!.message.content).to.equal(expected.text);
      expect(deltas.join('')).to.equal(expected.text);
      const usage = { prompt_tokens: expected.promptTokens, completion_tokens: expected.completionTokens, total_tokens: expected.promptTokens + expected.completionTokens };
      expect(final.usage).to.deep.equal(usage);
      expect(await tokensOf(m)).to.deep.equal(usage);
    });
  });

  describe('@anthropic-ai/sdk', () => {
    it('streams with messages.create({stream: true}) (\\r\\n line endings); the record counts input with cache tokens', async () => {
      const m = marker();
      provider.enqueue({
        kind: 'sse',
        frames: messagesFrames(['Bon', 'jour'], { lineEnding: '\r\n', inputTokens: 7, cacheCreationInputTokens: 3, cacheReadInputTokens: 2, outputTokens: 11 }),
        frameDelayMs: 5,
      });
      const client = new Anthropic({ baseURL: t.root, apiKey: t.key, maxRetries: 0 });
      const stream = await client.messages.create({ model: 'claude-test', max_tokens: 64, stream: true, messages: [{ role: 'user', content: m }] });
      const types: string[] = [];
      let text = '';
      for await (const ev of stream) {
        types.push(ev.type);
        if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
      }
      expect(text).to.equal('Bonjour');
      expect(types[0]).to.equal('message_start');
      expect(types[types.length - 1]).to.equal('message_stop');
      expect(provider.journal[0]!.path).to.equal('/v1/messages');
      expect(await tokensOf(m)).to.deep.equal({ prompt_tokens: 12, completion_tokens: 11, total_tokens: 23 });
    });

    it('messages.stream(...).finalMessage() assembles the message', async () => {
      const m = marker();
      const body = { model: 'claude-test', max_tokens: 64, messages: [{ role: 'user' as const, content: `a streamed hello ${m}` }] };
      const expected = defaultAnswer(body);
      const client = new Anthropic({ baseURL: t.root, apiKey: t.key, maxRetries: 0 });
      const stream = client.messages.stream(body);
      const deltas: string[] = [];
      stream.on('text', (delta) => deltas.push(delta));
      const message = await stream.finalMessage();
      expect(message.content).to.deep.equal([{ type: 'text', text: expected.text }]);
      expect(deltas.join('')).to.equal(expected.text);
      expect(message.usage.input_tokens).to.equal(expected.promptTokens);
      expect(message.usage.output_tokens).to.equal(expected.completionTokens);
      expect(await tokensOf(m)).to.deep.equal({
        prompt_tokens: expected.promptTokens,
        completion_tokens: expected.completionTokens,
        total_tokens: expected.promptTokens + expected.completionTokens,
      });
    });
  });

  describe('raw bytes', () => {
    // One SSE frame per element: a comment, CRLF and CR endings, multi-line data with an
    // unknown event name, a UTF-8 character, and a final frame without its blank line.
    const awkward = (m: string) => [
      ': ping\n\n',
      `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"${m} "},"finish_reason":null}]}\r\n\r\n`,
      'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"caf\u00e9 \u6771\u4eac \ud83d\ude80"},"finish_reason":null}]}\r\r',
      'event: note\ndata: line one\ndata: line two\n\n',
      ':\r\n\r\n',
      'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
      'data: [DONE]\n',
    ];

    it('the caller receives exactly the provider\'s bytes, and replay numbers exactly its frames', async () => {
      const m = marker();
      const frames = awkward(m);
      provider.enqueue({ kind: 'sse', frames, frameDelayMs: 3 });
      const live = await postStream(t, '/chat/completions', { model: 'gpt-test', stream: true, messages: [{ role: 'user', content: m }] }).done;
      expect(live.status).to.equal(200);
      expect(live.headers['content-type']).to.match(/^text\/event-stream/);
      expect(live.body.equals(bytesOf(frames)), live.body.toString('latin1')).to.equal(true);
      const id = await requestIdByMarker(server.db, m);
      const replayed = await replayStream(t, id).done;
      expect(replayed.body.equals(withIds(frames))).to.equal(true);
      expect(stripIds(replayed.body).equals(bytesOf(frames))).to.equal(true);
    });

    it('frames split across network reads at awkward bytes (inside \\r\\n, inside a UTF-8 character) are reassembled', async () => {
      const m = marker();
      const frames = awkward(m);
      const all = bytesOf(frames);
      // Cut points: between the \r and \n of a CRLF, inside the 4-byte rocket, and every 7 bytes elsewhere.
      const cuts = new Set<number>();
      cuts.add(all.indexOf('\r\n\r\n') + 1);
      cuts.add(all.indexOf(Buffer.from('\u{1F680}')) + 2);
      for (let i = 7; i < all.length; i += 7) cuts.add(i);
      const sorted = [...cuts].sort((a, b) => a - b);
      const pieces = sorted.map((c, i) => all.subarray(i === 0 ? 0 : sorted[i - 1], c));
      pieces.push(all.subarray(sorted[sorted.length - 1]));
      provider.enqueue({ kind: 'sse', frames: pieces, frameDelayMs: 1 });
      const live = await postStream(t, '/chat/completions', { model: 'gpt-test', stream: true, messages: [{ role: 'user', content: m }] }).done;
      expect(live.status).to.equal(200);
      expect(live.body.equals(all)).to.equal(true);
      const replayed = await replayStream(t, await requestIdByMarker(server.db, m)).done;
      expect(replayed.body.equals(withIds(frames)), replayed.body.toString('latin1')).to.equal(true);
    });

    it('the messages route passes the provider\'s own event names and pings through unchanged', async () => {
      const m = marker();
      const frames = messagesFrames(['one ', 'two'], { lineEnding: '\r\n' });
      provider.enqueue({ kind: 'sse', frames, frameDelayMs: 2 });
      const live = await postStream(t, '/messages', { model: 'claude-test', max_tokens: 8, stream: true, messages: [{ role: 'user', content: m }] }).done;
      expect(live.status).to.equal(200);
      expect(live.body.equals(bytesOf(frames))).to.equal(true);
      expect(live.body.toString()).to.not.match(/^id:/m);
    });
  });
});
