// The floor of the long streams: the least a Node proxy can do, in a process of its own. It
// forwards each POST to the provider with node:http and pipes the answer back as it comes,
// storing nothing, parsing nothing, checking nothing. What it spends a frame is what reading a
// frame from one socket and writing it to another costs Node on this machine, so it bounds from
// below what any Node proxy, Sarsen included, spends
// (docs/performance.md "What bounds the figures"). Prints `listening <url>` once bound.
//
//   node bench/lib/relay-process.ts --to http://127.0.0.1:PORT
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { parseArgs } from 'node:util';

const { values: args } = parseArgs({ options: { to: { type: 'string' } } });
if (!args.to) throw new Error('usage: relay-process.ts --to <provider origin>');
const to = new URL(args.to);
const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });

const server = http.createServer((req, res) => {
  const upstream = http.request(
    { host: to.hostname, port: to.port, method: req.method, path: req.url, headers: { 'content-type': req.headers['content-type'] ?? 'application/json', authorization: req.headers.authorization ?? '' }, agent },
    (answer) => {
      res.writeHead(answer.statusCode ?? 502, { 'content-type': answer.headers['content-type'] ?? 'application/octet-stream' });
      answer.pipe(res);
    },
  );
  upstream.on('error', () => res.destroy());
  req.pipe(upstream);
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`listening http://127.0.0.1:${(server.address() as AddressInfo).port}\n`);
});
