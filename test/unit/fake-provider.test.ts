import { expect } from 'chai';
import http from 'node:http';
import { createParser } from 'eventsource-parser';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import {
  startFakeProvider, chatFrames, messagesFrames, defaultAnswer, splitText,
} from '../support/fake-provider.ts';
import type { FakeProvider } from '../support/fake-provider.ts';

const CHAT = '/v1/chat/completions';
const MSGS = '/v1/messages';

function post(url: string, body: unknown, init: { headers?: Record<string, string>; signal?: AbortSignal } = {}) {
  return fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...init.headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
    signal: init.signal,
  });
}

function parseSse(text: string) {
  const events: { event?: string; data: string }[] = [];
  const parser = createParser({ onEvent: (e) => events.push({ event: e.event, data: e.data }) });
  parser.feed(text);
  return events;
}

/** Reads a body chunk by chunk, keeping the bytes that arrived before any transport error. */
async function readUntilError(res: Response): Promise<{ bytes: Buffer; error?: unknown }> {
  const parts: Buffer[] = [];
  const reader = res.body!.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return { bytes: Buffer.concat(parts) };
      parts.push(Buffer.from(value));
    }
  } catch (error) {
    return { bytes: Buffer.concat(parts), error };
  }
}

const activeCount = (name: string) => process.getActiveResourcesInfo().filter((r) => r === name).length;

describe('fake provider', () => {
  let p: FakeProvider;
  beforeEach(async () => { p = await startFakeProvider(); });
  afterEach(async () => { await p.close(); });

  describe('default answers', () => {
    it('answers a chat completion deterministically from the request', async () => {
      const res = await post(p.url + CHAT, { model: 'gpt-x', messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello   marker-7' }] });
      expect(res.status).to.equal(200);
      expect(res.headers.get('content-type')).to.equal('application/json');
      const body: any = await res.json();
      expect(body).to.include({ object: 'chat.completion', model: 'gpt-x' });
      expect(body.id).to.be.a('string');
      expect(body.created).to.be.a('number');
      expect(body.choices[0].message).to.deep.include({ role: 'assistant', content: 'fake reply to 2 message(s) [hello marker-7]' });
      expect(body.choices[0].finish_reason).to.equal('stop');
      // prompt: (1 + 2 words) per message; completion: 7 words of the text
      expect(body.usage).to.deep.equal({ prompt_tokens: 6, completion_tokens: 7, total_tokens: 13 });
      expect(p.journal[0]).to.include({ method: 'POST', path: CHAT, behavior: 'default', clientAborted: false });
    });

    it('answers a messages call with the vendor shape and array content', async () => {
      const req = { model: 'claude-x', max_tokens: 10, system: 'two words', messages: [{ role: 'user', content: [{ type: 'text', text: 'abc' }, { type: 'text', text: 'def' }] }] };
      const res = await post(p.url + MSGS, req);
      const body: any = await res.json();
      expect(body).to.include({ type: 'message', role: 'assistant', model: 'claude-x', stop_reason: 'end_turn' });
      expect(body.content).to.deep.equal([{ type: 'text', text: 'fake reply to 1 message(s) [abc def]' }]);
      expect(body.usage).to.deep.equal({ input_tokens: 5, output_tokens: 7, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 });
      expect(res.headers.get('request-id')).to.equal(`req_fake_${p.journal[0].seq}`);
    });

    it('streams chat chunks, with the usage chunk only when include_usage is set', async () => {
      const req = { model: 'm1', stream: true, messages: [{ role: 'user', content: 'stream me' }] };
      for (const includeUsage of [false, true]) {
        const res = await post(p.url + CHAT, includeUsage ? { ...req, stream_options: { include_usage: true } } : req);
        expect(res.headers.get('content-type')).to.equal('text/event-stream');
        const events = parseSse(await res.text());
        expect(events.at(-1)!.data).to.equal('[DONE]');
        const chunks = events.slice(0, -1).map((e) => JSON.parse(e.data));
        expect(chunks.every((c) => c.object === 'chat.completion.chunk' && c.model === 'm1')).to.equal(true);
        const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
        expect(text).to.equal(defaultAnswer(req).text);
        const usage = chunks.filter((c) => c.usage);
        expect(usage.length).to.equal(includeUsage ? 1 : 0);
        if (includeUsage) expect(usage[0].choices).to.deep.equal([]);
      }
    });

    it('streams the messages event sequence with frameCount content deltas', async () => {
      p.enqueue({ kind: 'default', frameCount: 7 });
      const req = { model: 'c1', max_tokens: 5, stream: true, messages: [{ role: 'user', content: 'count frames' }] };
      const events = parseSse(await (await post(p.url + MSGS, req)).text());
      expect(events.map((e) => e.event)).to.deep.equal([
        'message_start', 'content_block_start', 'ping', ...Array(7).fill('content_block_delta'),
        'content_block_stop', 'message_delta', 'message_stop',
      ]);
      const data = events.map((e) => JSON.parse(e.data));
      expect(data.map((d) => d.type)).to.deep.equal(events.map((e) => e.event));
      expect(data[0].message.usage.input_tokens).to.equal(defaultAnswer(req).promptTokens);
      expect(data.filter((d) => d.delta?.type === 'text_delta').map((d) => d.delta.text).join('')).to.equal(defaultAnswer(req).text);
      expect(data.at(-2)).to.deep.include({ usage: { output_tokens: defaultAnswer(req).completionTokens } });
    });

    it('honours delayMs and frameDelayMs', async () => {
      p.enqueue({ kind: 'default', delayMs: 120 }, { kind: 'default', frameDelayMs: 40, frameCount: 3 });
      let t0 = Date.now();
      await (await post(p.url + CHAT, { model: 'm', messages: [] })).json();
      expect(Date.now() - t0).to.be.at.least(110);
      t0 = Date.now();
      // role + 3 content + finish + [DONE] = 6 frames, so 5 gaps of 40 ms
      const text = await (await post(p.url + CHAT, { model: 'm', stream: true, messages: [] })).text();
      expect(Date.now() - t0).to.be.at.least(190);
      expect(parseSse(text)).to.have.length(6);
    });

    it('answers 404 JSON for unknown paths and 400 for a non-JSON body', async () => {
      const res = await fetch(p.url + '/v2/nothing');
      expect(res.status).to.equal(404);
      expect(res.headers.get('content-type')).to.equal('application/json');
      expect(((await res.json()) as any).error.message).to.contain('/v2/nothing');
      const bad = await post(p.url + MSGS, 'not json{');
      expect(bad.status).to.equal(400);
      expect(((await bad.json()) as any).type).to.equal('error');
      expect(p.journal[1].json).to.equal(undefined);
    });
  });

  describe('scripted behaviors', () => {
    it('json sends the scripted status, headers and body bytes after delayMs', async () => {
      p.enqueue(
        { kind: 'json', status: 201, headers: { 'x-extra': 'yes' }, body: { a: 1 } },
        { kind: 'json', body: '{"b" : 2 }', delayMs: 80 },
        { kind: 'json', body: Buffer.from([0x7b, 0x7d]) },
      );
      const r1 = await post(p.url + CHAT, {});
      expect([r1.status, r1.headers.get('x-extra'), await r1.text()]).to.deep.equal([201, 'yes', '{"a":1}']);
      const t0 = Date.now();
      const r2 = await post(p.url + CHAT, {});
      expect(await r2.text()).to.equal('{"b" : 2 }');
      expect(Date.now() - t0).to.be.at.least(70);
      expect(await (await post(p.url + CHAT, {})).text()).to.equal('{}');
    });

    it('sse delivers raw frames byte for byte, whatever the line endings', async () => {
      const frames = [
        ': ping\n\n', 'data: one\r\n\r\n', 'event: x\rdata: two\r\r',
        Buffer.from([0x64, 0x61, 0x74, 0x61, 0x3a, 0x20, 0xc3]), Buffer.from([0xa9, 0x0a, 0x0a]), 'data: [DONE]\n\n',
      ];
      p.enqueue({ kind: 'sse', frames, headers: { 'x-stream': '1' } });
      const res = await post(p.url + CHAT, { stream: true });
      expect(res.headers.get('content-type')).to.equal('text/event-stream');
      expect(res.headers.get('x-stream')).to.equal('1');
      const bytes = Buffer.from(await res.arrayBuffer());
      expect(bytes.equals(Buffer.concat(frames.map((f) => Buffer.from(f))))).to.equal(true);
    });

    it('sse sends headers at once and the first frame after firstDelayMs', async () => {
      // At once: the headers come while the first frame is held back.
      let release!: () => void;
      p.enqueue({ kind: 'sse', frames: ['data: a\n\n', 'data: b\n\n'], waitBefore: { 0: new Promise<void>((r) => (release = r)) } });
      const res = await post(p.url + CHAT, {});
      expect(res.headers.get('content-type')).to.equal('text/event-stream');
      release();
      expect(await res.text()).to.equal('data: a\n\ndata: b\n\n');
      p.enqueue({ kind: 'sse', frames: ['data: a\n\n'], firstDelayMs: 400 });
      const t0 = Date.now();
      expect(await (await post(p.url + CHAT, {})).text()).to.equal('data: a\n\n');
      expect(Date.now() - t0).to.be.at.least(390);
    });

    it('sse holds a frame until its waitBefore promise settles, and sends the frames before it at once', async () => {
      let release!: () => void;
      p.enqueue({ kind: 'sse', frames: ['data: a\n\n', 'data: b\n\n'], waitBefore: { 1: new Promise<void>((r) => (release = r)) } });
      const res = await post(p.url + CHAT, {});
      const reader = res.body!.getReader();
      expect(Buffer.from((await reader.read()).value!).toString()).to.equal('data: a\n\n');
      release();
      expect(Buffer.from((await reader.read()).value!).toString()).to.equal('data: b\n\n');
      expect((await reader.read()).done).to.equal(true);
    });

    it('sse dropAfter cuts the connection after that many frames', async () => {
      const frames = chatFrames(['a', 'b', 'c']);
      p.enqueue({ kind: 'sse', frames, dropAfter: 2 }, { kind: 'sse', frames, dropAfter: 0 });
      for (const n of [2, 0]) {
        const res = await post(p.url + CHAT, {});
        expect(res.status).to.equal(200);
        const { bytes, error } = await readUntilError(res);
        expect(error, `dropAfter ${n}`).to.be.instanceOf(Error);
        expect(bytes.toString()).to.equal(frames.slice(0, n).join(''));
      }
      expect(p.journal.map((e) => e.clientAborted)).to.deep.equal([false, false]);
    });

    it('refuse sends status, body and retry-after as JSON', async () => {
      p.enqueue(
        { kind: 'refuse', status: 429, retryAfter: '7', body: { error: { message: 'slow down' } } },
        { kind: 'refuse', status: 529, body: 'overloaded!' },
        { kind: 'refuse', status: 503 },
      );
      const r1 = await post(p.url + MSGS, {});
      expect([r1.status, r1.headers.get('retry-after'), r1.headers.get('content-type')]).to.deep.equal([429, '7', 'application/json']);
      expect(await r1.json()).to.deep.equal({ error: { message: 'slow down' } });
      const r2 = await post(p.url + MSGS, {});
      expect([r2.status, r2.headers.get('retry-after'), await r2.text()]).to.deep.equal([529, null, 'overloaded!']);
      const r3 = await post(p.url + MSGS, {});
      expect(((await r3.json()) as any).error.type).to.equal('api_error');
    });

    it('drop destroys the connection before any byte and is journalled', async () => {
      p.enqueue({ kind: 'drop' });
      let err: unknown;
      await post(p.url + CHAT, { model: 'm', messages: [] }).catch((e) => { err = e; });
      expect(err).to.be.instanceOf(Error);
      expect(p.journal).to.have.length(1);
      expect(p.journal[0]).to.include({ behavior: 'drop', clientAborted: false });
    });

    it('hang records clientAborted when the client goes away', async () => {
      p.enqueue({ kind: 'hang' });
      const ac = new AbortController();
      const pending = post(p.url + CHAT, { model: 'm' }, { signal: ac.signal }).catch((e) => e);
      const [entry] = await p.waitForRequests(1);
      expect(entry).to.include({ behavior: 'hang', clientAborted: false });
      expect(entry.finishedAt).to.equal(undefined);
      ac.abort();
      await pending;
      await p.waitUntil(() => entry.clientAborted);
      expect(entry.finishedAt).to.be.a('number');
    });

    it('a client abort during a delay cancels the scripted answer', async () => {
      // The delay is a timer of the provider's; cancelled, it is gone, and nothing is left to answer.
      // Clients without an agent or fetch, so that every timer counted is the provider's.
      const open = () => {
        const req = http.request(p.url + CHAT, { method: 'POST', agent: false });
        const firstBytes = new Promise<string>((resolve) => req.on('response', (res) => res.once('data', (c: Buffer) => resolve(c.toString('utf8')))));
        req.on('error', () => undefined);
        req.end('{}');
        return { req, firstBytes };
      };
      // A first answer brings up whatever timers the server keeps per connection.
      expect(await open().firstBytes).to.contain('chat.completion');
      p.enqueue({ kind: 'json', body: {}, delayMs: 600_000 }, { kind: 'sse', frames: ['a\n\n', 'b\n\n'], frameDelayMs: 600_000 });
      for (const kind of ['json', 'sse'] as const) {
        const idle = activeCount('Timeout');
        const { req, firstBytes } = open();
        const [entry] = (await p.waitForRequests(p.journal.length + 1)).slice(-1);
        // The sse answer's delay starts after its first frame.
        if (kind === 'sse') expect(await firstBytes).to.equal('a\n\n');
        expect(activeCount('Timeout'), `${kind}: the delay is running`).to.equal(idle + 1);
        req.destroy();
        await p.waitUntil(() => entry!.clientAborted);
        expect(activeCount('Timeout'), `${kind}: the delay is cancelled`).to.equal(idle);
      }
    });

    it('a json answer with `after` waits for it, and never answers a client that went away', async () => {
      let release!: () => void;
      const after = new Promise<void>((r) => (release = r));
      p.enqueue({ kind: 'json', body: { n: 1 }, after }, { kind: 'json', body: { n: 2 }, after });
      const ac = new AbortController();
      const gone = post(p.url + CHAT, {}, { signal: ac.signal }).catch((e) => e);
      const [first] = await p.waitForRequests(1);
      const answered = post(p.url + CHAT, {});
      await p.waitForRequests(2);
      expect(p.journal.map((e) => e.finishedAt)).to.deep.equal([undefined, undefined]);
      ac.abort();
      expect(await gone).to.be.instanceOf(Error);
      await p.waitUntil(() => first!.clientAborted);
      release();
      expect(await (await answered).json()).to.deep.equal({ n: 2 });
    });

    it('hang is ended by close(), which leaves no server or socket open', async () => {
      const servers = activeCount('TCPServerWrap');
      const q = await startFakeProvider();
      q.enqueue({ kind: 'hang' });
      expect(activeCount('TCPServerWrap')).to.equal(servers + 1);
      const failed = new Promise<Error>((resolve) => {
        const req = http.request(q.url + CHAT, { method: 'POST', agent: false }, () => resolve(new Error('answered')));
        req.on('error', resolve);
        req.end('{}');
      });
      await q.waitForRequests(1);
      const sockets = activeCount('TCPSocketWrap');
      await q.close();
      expect((await failed).message).to.not.equal('answered');
      expect(q.journal[0].clientAborted).to.equal(false);
      expect(activeCount('TCPServerWrap')).to.equal(servers);
      while (activeCount('TCPSocketWrap') > sockets - 2) await new Promise((r) => setTimeout(r, 10));
      expect(activeCount('TCPSocketWrap')).to.be.at.most(sockets - 2);
      const after = await fetch(q.url + CHAT).catch((e) => e);
      expect(after).to.be.instanceOf(Error);
    });
  });

  describe('scripting and journal', () => {
    it('takes queued behaviors first, then rules, then the default', async () => {
      p.enqueue({ kind: 'refuse', status: 500 }, { kind: 'refuse', status: 502 });
      const off = p.rule((e) => (e.json?.model === 'ruled' ? { kind: 'refuse', status: 418 } : undefined));
      p.rule(() => ({ kind: 'refuse', status: 400 }));
      const statuses: number[] = [];
      for (const model of ['ruled', 'ruled', 'ruled', 'other']) statuses.push((await post(p.url + CHAT, { model, messages: [] })).status);
      off();
      statuses.push((await post(p.url + CHAT, { model: 'ruled', messages: [] })).status);
      expect(statuses).to.deep.equal([500, 502, 418, 400, 400]);
      p.reset();
      expect(p.journal).to.have.length(0);
      expect((await post(p.url + CHAT, { model: 'ruled', messages: [] })).status).to.equal(200);
      expect(p.journal.map((e) => e.behavior)).to.deep.equal(['default']);
    });

    it('captures headers, raw headers and exact body bytes', async () => {
      const body = '{"model":"m","x":1.0,  "messages":[]}';
      await new Promise<void>((resolve, reject) => {
        const req = http.request(p.url + CHAT, { method: 'POST', agent: false, headers: [
          'Host', new URL(p.url).host, 'Content-Type', 'application/json', 'X-Custom', 'a', 'X-Custom', 'b', 'Authorization', 'Bearer sk-test',
        ] as unknown as http.OutgoingHttpHeaders }, (res) => { res.resume(); res.on('end', resolve); });
        req.on('error', reject);
        req.end(body);
      });
      const [e] = await p.waitForRequests(1);
      expect(e.body.equals(Buffer.from(body))).to.equal(true);
      expect(e.json).to.deep.equal({ model: 'm', x: 1, messages: [] });
      expect(e.headers.authorization).to.equal('Bearer sk-test');
      expect(e.headers['x-custom']).to.equal('a, b');
      expect(e.rawHeaders).to.include.members(['X-Custom', 'a', 'b']);
      expect(e.receivedAt).to.be.at.most(e.finishedAt!);
    });

    it('keeps connections alive between requests', async () => {
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      const once = () => new Promise<boolean>((resolve, reject) => {
        const req = http.request(p.url + CHAT, { method: 'POST', agent }, (res) => { res.resume(); res.on('end', () => resolve(req.reusedSocket)); });
        req.on('error', reject);
        req.end('{"model":"m","messages":[]}');
      });
      try {
        expect([await once(), await once()]).to.deep.equal([false, true]);
      } finally { agent.destroy(); }
    });

    it('waitForRequests times out with a clear error', async () => {
      const err = await p.waitForRequests(1, 50).catch((e) => e);
      expect(err.message).to.match(/within 50 ms/);
    });
  });

  describe('frame builders', () => {
    it('chatFrames and messagesFrames parse the same under every line ending', () => {
      const parsed = (le: '\n' | '\r\n' | '\r') => [
        parseSse(chatFrames(['x', 'y'], { usage: true, lineEnding: le }).join('')),
        parseSse(messagesFrames(['x', 'y'], { lineEnding: le }).join('')),
      ];
      const lf = parsed('\n');
      expect(lf[0]).to.have.length(6);
      expect(lf[1]).to.have.length(8);
      expect(parsed('\r\n')).to.deep.equal(lf);
      expect(parsed('\r')).to.deep.equal(lf);
      expect(chatFrames(['x'], { lineEnding: '\r\n' })[1]).to.match(/^data: \{.*\}\r\n\r\n$/);
    });

    it('splitText keeps every code point and gives exactly n pieces', () => {
      expect(splitText('ab😀cd', 3)).to.deep.equal(['a', 'b😀', 'cd']);
      expect(splitText('ab', 4).join('')).to.equal('ab');
      expect(splitText('ab', 4)).to.have.length(4);
    });
  });

  describe('official SDKs', () => {
    it('openai completes a non-stream and a stream call', async () => {
      const client = new OpenAI({ baseURL: p.url + '/v1', apiKey: 'x', maxRetries: 0 });
      const messages = [{ role: 'user' as const, content: 'sdk marker' }];
      const done = await client.chat.completions.create({ model: 'gpt-sdk', messages });
      expect(done.choices[0].message.content).to.equal('fake reply to 1 message(s) [sdk marker]');
      expect(done.usage?.total_tokens).to.equal(done.usage!.prompt_tokens + done.usage!.completion_tokens);
      const stream = await client.chat.completions.create({ model: 'gpt-sdk', messages, stream: true, stream_options: { include_usage: true } });
      let text = '';
      let usage: unknown;
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? '';
        if (chunk.usage) usage = chunk.usage;
      }
      expect(text).to.equal(done.choices[0].message.content);
      expect(usage).to.deep.equal(done.usage);
      expect(p.journal[0].headers.authorization).to.equal('Bearer x');
    });

    it('anthropic completes a non-stream and a stream call', async () => {
      const client = new Anthropic({ baseURL: p.url, apiKey: 'x', maxRetries: 0 });
      const params = { model: 'claude-sdk', max_tokens: 64, messages: [{ role: 'user' as const, content: 'sdk marker' }] };
      const done = await client.messages.create(params);
      expect(done.content).to.deep.equal([{ type: 'text', text: 'fake reply to 1 message(s) [sdk marker]' }]);
      const stream = client.messages.stream(params);
      const deltas: string[] = [];
      stream.on('text', (t) => deltas.push(t));
      const final = await stream.finalMessage();
      expect(deltas.join('')).to.equal('fake reply to 1 message(s) [sdk marker]');
      expect(final.content).to.deep.equal(done.content);
      expect(final.usage.output_tokens).to.equal(done.usage.output_tokens);
      expect(final.stop_reason).to.equal('end_turn');
      // SDK 1.x sends the key as a bearer token; older ones used x-api-key
      const h = p.journal[0].headers;
      expect(h['x-api-key'] ?? h.authorization).to.match(/^(Bearer )?x$/);
      expect(h['anthropic-version']).to.be.a('string');
    });

    it('openai completes a Responses call and a Responses stream, events in sequence_number order', async () => {
      const client = new OpenAI({ baseURL: p.url + '/v1', apiKey: 'x', maxRetries: 0 });
      const params = { model: 'gpt-sdk', instructions: 'be brief', input: 'sdk marker' };
      const done = await client.responses.create(params);
      expect(done.output_text).to.equal('fake reply to 1 message(s) [sdk marker]');
      expect(done.usage).to.include({ input_tokens: 2 + 1 + 2, output_tokens: 7, total_tokens: 12 });
      expect(p.journal[0].path).to.equal('/v1/responses');
      const stream = client.responses.stream(params);
      const deltas: string[] = [];
      const seqs: number[] = [];
      stream.on('event', (e) => seqs.push(e.sequence_number));
      stream.on('response.output_text.delta', (e) => deltas.push(e.delta));
      const final = await stream.finalResponse();
      expect(deltas.join('')).to.equal(done.output_text);
      expect(final.output_text).to.equal(done.output_text);
      expect(final.usage).to.deep.equal(done.usage);
      expect(seqs).to.deep.equal(seqs.map((_, i) => i));
      expect(seqs.length).to.equal(12);
    });
  });
});
