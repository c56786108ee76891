// Small HTTP helpers for tests: raw requests that keep the answer's bytes, and polling.
import http from 'node:http';
import net from 'node:net';

export type RawResponse = { status: number; headers: http.IncomingHttpHeaders; body: Buffer };

/** One request on its own connection; the answer's body is kept as bytes. */
export function rawRequest(
  url: string,
  opts: { method?: string; headers?: Record<string, string>; body?: string | Buffer; timeoutMs?: number } = {},
): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: opts.method ?? 'GET', headers: opts.headers, agent: false, timeout: opts.timeoutMs }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.on('timeout', () => req.destroy(new Error(`no answer within ${opts.timeoutMs} ms`)));
    req.end(opts.body);
  });
}

// Tests read answers as loosely typed JSON.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export function json(res: RawResponse): any {
  return JSON.parse(res.body.toString('utf8'));
}

/** Polls `fn` until it returns a value (not undefined), or fails after `timeoutMs`. */
export async function until<T>(fn: () => Promise<T | undefined>, timeoutMs = 15_000, everyMs = 25): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error('condition not reached in time');
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/**
 * Writes `head` (request line and headers, as bytes: nothing re-encodes or checks them) and
 * `body` on a socket of its own, and reads the answer until the server closes the connection
 * (the request should say `connection: close`). Answers what came back, split at the first
 * blank line.
 */
export function socketRequest(url: string, head: Buffer, body: Buffer = Buffer.alloc(0)): Promise<RawResponse & { raw: Buffer }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const socket = net.connect(Number(port), hostname, () => socket.write(Buffer.concat([head, body])));
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('error', reject);
    socket.on('close', () => {
      const raw = Buffer.concat(chunks);
      const split = raw.indexOf('\r\n\r\n');
      if (split < 0) return reject(new Error(`no complete answer: ${JSON.stringify(raw.toString('latin1'))}`));
      const [statusLine, ...lines] = raw.subarray(0, split).toString('latin1').split('\r\n');
      const headers: http.IncomingHttpHeaders = {};
      for (const line of lines) {
        const colon = line.indexOf(':');
        headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
      }
      resolve({ status: Number(statusLine!.split(' ')[1]), headers, body: raw.subarray(split + 4), raw });
    });
  });
}

/** The bytes of a request head: request line, headers (values given as bytes or text), blank line. */
export function requestHead(method: string, path: string, headers: [string, string | Buffer][]): Buffer {
  const parts: Buffer[] = [Buffer.from(`${method} ${path} HTTP/1.1\r\n`)];
  for (const [name, value] of headers) parts.push(Buffer.from(`${name}: `), Buffer.from(value), Buffer.from('\r\n'));
  parts.push(Buffer.from('\r\n'));
  return Buffer.concat(parts);
}

export type RouteEntry = { method: string; path: string };

/** Every method and path the application's router knows, read from the router itself. */
export function routeTable(app: { router: unknown }): RouteEntry[] {
  type Layer = { route?: { path: string; methods: Record<string, boolean> }; handle?: { stack?: Layer[] }; rawPath?: unknown };
  const walk = (stack: Layer[], prefix: string): RouteEntry[] =>
    stack.flatMap((layer) => {
      if (layer.route) {
        return Object.keys(layer.route.methods)
          .filter((m) => m !== '_all')
          .map((m) => ({ method: m.toUpperCase(), path: prefix + layer.route!.path }));
      }
      const mount = typeof layer.rawPath === 'string' && layer.rawPath !== '/' ? layer.rawPath : '';
      return layer.handle?.stack ? walk(layer.handle.stack, prefix + mount) : [];
    });
  return walk((app.router as { stack: Layer[] }).stack, '');
}
