// The provider of the side-by-side benchmark, in a process of its own so that neither the load
// generator nor the proxies share its event loop: a chat-dialect endpoint answering at once
// with a fixed completion, or, when the body asks for a stream, `--frames` SSE frames written
// `--pace` ms apart on a fixed schedule. Prints `listening <url>` once bound.
//
// With --record, each stream's frames name it (the first message's content, as in
// stream-provider.ts) and the provider keeps when each request arrived and each frame was
// written (ms since the epoch, a clock other processes on the machine share), answered and
// forgotten by `GET /__bench/times`.
//
//   node bench/lib/provider-process.ts [--frames 50] [--pace 20] [--record]
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { parseArgs } from 'node:util';
import { frameText } from './stream-provider.ts';

const { values: args } = parseArgs({
  options: { frames: { type: 'string', default: '50' }, pace: { type: 'string', default: '20' }, record: { type: 'boolean', default: false } },
});
const FRAMES = Number(args.frames);
const PACE = Number(args.pace);
const RECORD = args.record;

type StreamTimes = { received: number; writes: number[] };
const times = new Map<string, StreamTimes>();
const epochMs = () => performance.timeOrigin + performance.now();

const ANSWER = Buffer.from(
  JSON.stringify({
    id: 'chatcmpl-bench',
    object: 'chat.completion',
    created: 1700000000,
    model: 'gpt-bench',
    choices: [{ index: 0, message: { role: 'assistant', content: 'a short answer from the benchmark provider' }, finish_reason: 'stop' }],
    usage: { prompt_tokens: 12, completion_tokens: 8, total_tokens: 20 },
  }),
);
const frame = (i: number) =>
  i === FRAMES - 1
    ? 'data: [DONE]\n\n'
    : `data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"gpt-bench","choices":[{"index":0,"delta":{"content":"word${i} "},"finish_reason":null}]}\n\n`;

function tagOf(body: Buffer): string {
  try {
    const content = (JSON.parse(body.toString('utf8')) as { messages?: { content?: unknown }[] }).messages?.[0]?.content;
    return typeof content === 'string' ? content : 'untagged';
  } catch {
    return 'untagged';
  }
}

function stream(res: http.ServerResponse, recorded: { tag: string; times: StreamTimes } | null): void {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const start = performance.now();
  let i = 0;
  let timer: NodeJS.Timeout | null = null;
  res.on('close', () => timer && clearTimeout(timer));
  const next = () => {
    // Every frame due by now goes out: a late timer catches up instead of shifting the schedule.
    while (i < FRAMES && performance.now() >= start + i * PACE - 0.5) {
      if (recorded) {
        recorded.times.writes.push(epochMs());
        res.write(frameText(recorded.tag, i, i === FRAMES - 1));
        i++;
      } else res.write(frame(i++));
      if (i === FRAMES) return void res.end();
    }
    timer = setTimeout(next, Math.max(0, start + i * PACE - performance.now()));
  };
  next();
}

const server = http.createServer({ keepAlive: true, keepAliveTimeout: 120_000 }, (req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    if (req.method === 'GET' && req.url === '/__bench/times') {
      const body = JSON.stringify(Object.fromEntries(times));
      times.clear();
      res.writeHead(200, { 'content-type': 'application/json' });
      return void res.end(body);
    }
    const body = Buffer.concat(chunks);
    if (/"stream"\s*:\s*true/.test(body.toString('latin1'))) {
      if (!RECORD) return stream(res, null);
      const received = epochMs();
      const tag = tagOf(body);
      const recorded = { tag, times: { received, writes: [] } };
      times.set(tag, recorded.times);
      return stream(res, recorded);
    }
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': ANSWER.length });
    res.end(ANSWER);
  });
});
server.keepAliveTimeout = 120_000;
server.maxConnections = 100_000;
server.listen({ port: 0, host: '127.0.0.1', backlog: 4096 }, () => {
  process.stdout.write(`listening http://127.0.0.1:${(server.address() as AddressInfo).port}\n`);
});
process.on('SIGTERM', () => process.exit(0));
