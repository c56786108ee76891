// The floor of the long streams: the least a Node proxy can do, in a process of its own. It
// forwards each POST to the provider with node:http and pipes the answer back as it comes,
// storing nothing, parsing nothing, checking nothing. What it spends a frame is what reading a
// frame from one socket and writing it to another costs Node on this machine, so it bounds from
// below what any Node proxy, Sarsen included, spends
// (docs/performance.md "What bounds the figures"). Prints `listening <url>` once bound.
//
// With --database (node-pg's connection settings as JSON), the least a durable Node proxy does:
// each request's body stored as one row and committed before the provider is called, and the
// provider's answer stored as another and committed before the caller gets it. Two durable
// commits in series from a Node process and nothing else: what the c=1 floor's two commits cost
// a proxy whose event loop waits for each (docs/performance.md "What bounds the figures").
//
//   node bench/lib/relay-process.ts --to http://127.0.0.1:PORT [--database '{"host":...}']
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { parseArgs } from 'node:util';
import pg from 'pg';

const { values: args } = parseArgs({ options: { to: { type: 'string' }, database: { type: 'string' } } });
if (!args.to) throw new Error('usage: relay-process.ts --to <provider origin> [--database <connection settings as JSON>]');
const to = new URL(args.to);
const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });

const TABLE = 'CREATE TABLE IF NOT EXISTS relay_records (id bigserial PRIMARY KEY, body bytea NOT NULL)';
const STORE = { name: 'relay_store', text: 'INSERT INTO relay_records (body) VALUES ($1)' };
// A connection a concurrent caller, as many as a benchmark level opens.
const pool = args.database ? new pg.Pool({ ...(JSON.parse(args.database) as pg.PoolConfig), max: 64 }) : null;
pool?.on('error', () => undefined);
if (pool) await pool.query(TABLE);

const read = async (from: http.IncomingMessage): Promise<Buffer> => {
  const parts: Buffer[] = [];
  for await (const part of from) parts.push(part as Buffer);
  return Buffer.concat(parts);
};

const upstreamOptions = (req: http.IncomingMessage): http.RequestOptions => ({
  host: to.hostname, port: to.port, method: req.method, path: req.url, agent,
  headers: { 'content-type': req.headers['content-type'] ?? 'application/json', authorization: req.headers.authorization ?? '' },
});

function relay(req: http.IncomingMessage, res: http.ServerResponse): void {
  const upstream = http.request(upstreamOptions(req), (answer) => {
    res.writeHead(answer.statusCode ?? 502, { 'content-type': answer.headers['content-type'] ?? 'application/octet-stream' });
    answer.pipe(res);
  });
  upstream.on('error', () => res.destroy());
  req.pipe(upstream);
}

async function durableRelay(db: pg.Pool, req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
  const body = await read(req);
  await db.query({ ...STORE, values: [body] });
  const answer = await new Promise<http.IncomingMessage>((resolve, reject) => {
    const upstream = http.request(upstreamOptions(req), resolve);
    upstream.on('error', reject);
    upstream.end(body);
  });
  const answered = await read(answer);
  await db.query({ ...STORE, values: [answered] });
  res.writeHead(answer.statusCode ?? 502, { 'content-type': answer.headers['content-type'] ?? 'application/octet-stream' });
  res.end(answered);
}

const server = http.createServer((req, res) => {
  if (pool) durableRelay(pool, req, res).catch(() => res.destroy());
  else relay(req, res);
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`listening http://127.0.0.1:${(server.address() as AddressInfo).port}\n`);
});
