// A counting PostgreSQL proxy for profiling (pg_stat_statements is not available): it sits
// between a Sarsen process and its database on 127.0.0.1, forwards bytes untouched, and reads
// the wire protocol on the side. Every ReadyForQuery the server sends closes one round trip;
// one whose transaction status is idle ('I') closes a transaction. Statement texts come from
// Parse and Query messages, parameter values (text format) from Bind, so a caller can follow
// one request id through the statements that name it.
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';

/** One round trip: the statement(s) sent before a Sync or simple Query, and its answer. */
export type RoundTrip = {
  conn: number;
  text: string;
  /** Text-format parameters of the last Bind in the round trip (null for binary or NULL). */
  params: (string | null)[];
  sentAt: number;
  doneAt: number;
  /** Transaction status after it: 'I' idle (a transaction ended), 'T' in one, 'E' failed. */
  status: string;
};

/** A NOTIFY delivered to one client connection: `pid` is the notifying server process. */
export type Notification = { conn: number; pid: number; channel: string; payload: string };

export type PgProxy = {
  port: number;
  host: string;
  /** Called for every completed round trip. */
  onRoundTrip(fn: (rt: RoundTrip) => void): void;
  /** Called for every notification the server delivers to a client. */
  onNotification(fn: (n: Notification) => void): void;
  close(): Promise<void>;
};

type Pending = { text: string; params: (string | null)[]; sentAt: number };

// Message framing shared by both directions: a type byte, then an int32 length that counts itself.
function frames(buf: Buffer, from: number, each: (type: number, body: Buffer) => void): number {
  let at = from;
  while (buf.length - at >= 5) {
    const len = buf.readInt32BE(at + 1);
    if (buf.length - at < 1 + len) break;
    each(buf[at]!, buf.subarray(at + 5, at + 1 + len));
    at += 1 + len;
  }
  return at;
}

function cstring(buf: Buffer, at: number): [string, number] {
  const end = buf.indexOf(0, at);
  return [buf.toString('utf8', at, end), end + 1];
}

function bindStatement(body: Buffer): string {
  return cstring(body, cstring(body, 0)[1])[0];
}

function bindParams(body: Buffer): (string | null)[] {
  let at = cstring(body, 0)[1]; // portal
  at = cstring(body, at)[1]; // statement
  const nFormats = body.readInt16BE(at);
  at += 2;
  const formats: number[] = [];
  for (let i = 0; i < nFormats; i++, at += 2) formats.push(body.readInt16BE(at));
  const n = body.readInt16BE(at);
  at += 2;
  const params: (string | null)[] = [];
  for (let i = 0; i < n; i++) {
    const len = body.readInt32BE(at);
    at += 4;
    const format = nFormats === 0 ? 0 : nFormats === 1 ? formats[0] : formats[i];
    params.push(len < 0 || format !== 0 ? null : body.toString('utf8', at, at + len));
    if (len > 0) at += len;
  }
  return params;
}

export async function startPgProxy(target: { host: string; port: number }): Promise<PgProxy> {
  const listeners: ((rt: RoundTrip) => void)[] = [];
  const notified: ((n: Notification) => void)[] = [];
  const sockets = new Set<net.Socket>();
  let nextConn = 0;

  const server = net.createServer((client) => {
    const conn = ++nextConn;
    const upstream = net.connect(target.port, target.host);
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    sockets.add(client).add(upstream);
    const pending: Pending[] = [];
    const prepared = new Map<string, string>(); // named statements: Bind names them, Parse is sent once
    let building: Pending = { text: '', params: [], sentAt: 0 };
    let started = false; // the untyped startup message has been seen
    let parse = true; // stops reading (never stops forwarding) on anything unexpected
    let inBuf: Buffer = Buffer.alloc(0);
    let outBuf: Buffer = Buffer.alloc(0);

    const fromClient = (type: number, body: Buffer) => {
      const t = String.fromCharCode(type);
      if (t === 'P') {
        const [name, at] = cstring(body, 0);
        building.text = cstring(body, at)[0];
        if (name) prepared.set(name, building.text);
      } else if (t === 'B') {
        building.params = bindParams(body);
        const name = bindStatement(body);
        if (name && !building.text) building.text = prepared.get(name) ?? `(prepared ${name})`;
      }
      else if (t === 'Q' || t === 'S') {
        if (t === 'Q') building.text = cstring(body, 0)[0];
        pending.push({ ...building, sentAt: performance.now() });
        building = { text: '', params: [], sentAt: 0 };
      }
    };
    const fromServer = (type: number, body: Buffer) => {
      if (type === 0x41 && notified.length > 0) {
        // 'A' NotificationResponse: pid, channel, payload
        const [channel, at] = cstring(body, 4);
        const n = { conn, pid: body.readInt32BE(0), channel, payload: cstring(body, at)[0] };
        for (const l of notified) l(n);
        return;
      }
      if (type !== 0x5a) return; // 'Z' ReadyForQuery
      const p = pending.shift();
      if (!p) return; // the one after authentication
      const rt: RoundTrip = { conn, ...p, doneAt: performance.now(), status: String.fromCharCode(body[0]!) };
      for (const l of listeners) l(rt);
    };

    client.on('data', (chunk: Buffer) => {
      upstream.write(chunk);
      if (!parse) return;
      try {
        inBuf = inBuf.length ? Buffer.concat([inBuf, chunk]) : chunk;
        let at = 0;
        if (!started) {
          if (inBuf.length < 8) return;
          const len = inBuf.readInt32BE(0);
          const code = inBuf.readInt32BE(4);
          if (code !== 196608) parse = false; // SSL, GSS or cancel request: not followed
          if (inBuf.length < len) return;
          started = true;
          at = len;
        }
        inBuf = inBuf.subarray(frames(inBuf, at, fromClient));
      } catch {
        parse = false;
      }
    });
    upstream.on('data', (chunk: Buffer) => {
      client.write(chunk);
      if (!parse) return;
      try {
        outBuf = outBuf.length ? Buffer.concat([outBuf, chunk]) : chunk;
        outBuf = outBuf.subarray(frames(outBuf, 0, fromServer));
      } catch {
        parse = false;
      }
    });
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on('close', end).on('error', end);
    upstream.on('close', end).on('error', end);
  });

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  return {
    host: '127.0.0.1',
    port: (server.address() as AddressInfo).port,
    onRoundTrip: (fn) => void listeners.push(fn),
    onNotification: (fn) => void notified.push(fn),
    close: async () => {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const s of sockets) s.destroy();
      await closed;
    },
  };
}
