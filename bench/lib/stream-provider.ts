// A paced streaming provider for the streaming benchmark: every POST is answered with `frames`
// chat-dialect SSE frames, one every `paceMs` on a fixed schedule from the request's arrival,
// and the moment each frame was written is kept (same process, same clock as the client), so
// a frame's delay is its arrival time minus its write time.
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { performance } from 'node:perf_hooks';

export type PacedProvider = {
  url: string;
  /** Write times (performance.now()) of each frame, by the stream's tag (the first message's content). */
  sent: Map<string, Float64Array>;
  /** When each stream's request had fully arrived (performance.now()), by tag. */
  received: Map<string, number>;
  /** Streams being written right now, and the most there were at once since `resetPeak`. */
  active(): number;
  peak(): number;
  resetPeak(): void;
  /** The pace of streams that start from now on. */
  setPace(ms: number): void;
  close(): Promise<void>;
};

/** Frame i of a stream: a chat.completion.chunk naming the stream and the index; the last is [DONE]. */
export function frameText(tag: string, i: number, last: boolean): string {
  if (last) return 'data: [DONE]\n\n';
  return `data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"gpt-bench","choices":[{"index":0,"delta":{"content":"${tag}:${i} "},"finish_reason":null}]}\n\n`;
}

function tagOf(body: Buffer): string {
  try {
    const json = JSON.parse(body.toString('utf8')) as { messages?: { content?: unknown }[] };
    const content = json.messages?.[0]?.content;
    return typeof content === 'string' ? content : 'untagged';
  } catch {
    return 'untagged';
  }
}

export async function startPacedProvider(opts: { frames: number; paceMs: number }): Promise<PacedProvider> {
  const sent = new Map<string, Float64Array>();
  const received = new Map<string, number>();
  const sockets = new Set<Socket>();
  let active = 0;
  let peak = 0;
  let paceMs = opts.paceMs;

  const stream = (tag: string, res: http.ServerResponse) => {
    const times = new Float64Array(opts.frames).fill(NaN);
    sent.set(tag, times);
    active++;
    peak = Math.max(peak, active);
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    const start = performance.now();
    const pace = paceMs;
    let i = 0;
    let timer: NodeJS.Timeout | null = null;
    const finish = () => {
      if (timer) clearTimeout(timer);
      timer = null;
      active--;
    };
    res.on('close', () => {
      if (i < opts.frames) finish(); // the reader went away early
    });
    const next = () => {
      timer = null;
      // Every frame due by now goes out (a late timer catches up rather than shifting the schedule).
      while (i < opts.frames && performance.now() >= start + i * pace - 0.5) {
        times[i] = performance.now();
        const last = i === opts.frames - 1;
        res.write(frameText(tag, i, last));
        i++;
        if (last) {
          finish();
          res.end();
          return;
        }
      }
      timer = setTimeout(next, Math.max(0, start + i * pace - performance.now()));
    };
    next();
  };

  const server = http.createServer({ keepAlive: true, keepAliveTimeout: 60_000 }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const tag = tagOf(Buffer.concat(chunks));
      received.set(tag, performance.now());
      stream(tag, res);
    });
    req.on('error', () => undefined);
  });
  server.on('connection', (s: Socket) => {
    s.setNoDelay(true);
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.maxConnections = 100_000;
  await new Promise<void>((resolve) => server.listen({ port: 0, host: '127.0.0.1', backlog: 4096 }, resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    sent,
    received,
    active: () => active,
    peak: () => peak,
    resetPeak: () => void (peak = active),
    setPace: (ms) => void (paceMs = ms),
    close: async () => {
      const closed = new Promise<void>((r) => server.close(() => r()));
      for (const s of sockets) s.destroy();
      await closed;
    },
  };
}
