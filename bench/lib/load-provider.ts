// The provider of the many-process benchmark, in a process of its own: it answers the mixed
// load's bodies (test/support/mixed-load.ts) with the bytes that load checks, at once, or as a
// stream of frames `--pace` ms apart. Prints `listening <url>` once bound.
//
//   node bench/lib/load-provider.ts [--pace 20]
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { parseArgs } from 'node:util';
import { expectedJson, expectedFrames } from '../../test/support/mixed-load.ts';

const { values: args } = parseArgs({ options: { pace: { type: 'string', default: '20' } } });
const PACE = Number(args.pace);

function stream(res: http.ServerResponse, frames: string[]): void {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  let i = 0;
  const next = () => {
    if (res.destroyed) return;
    res.write(frames[i++]);
    if (i === frames.length) res.end();
    else setTimeout(next, PACE);
  };
  next();
}

const server = http.createServer({ keepAlive: true, keepAliveTimeout: 120_000 }, (req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const text = Buffer.concat(chunks).toString('utf8');
    const marker = /"content":"(m-[0-9a-f]+)"/.exec(text)?.[1] ?? 'm-unknown';
    if (/"stream":true/.test(text)) return stream(res, expectedFrames(marker));
    const body = Buffer.from(expectedJson(marker));
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
    res.end(body);
  });
});
server.keepAliveTimeout = 120_000;
server.maxConnections = 100_000;
server.listen({ port: 0, host: '127.0.0.1', backlog: 4096 }, () => {
  process.stdout.write(`listening http://127.0.0.1:${(server.address() as AddressInfo).port}\n`);
});
process.on('SIGTERM', () => process.exit(0));
