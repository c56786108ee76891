// A userspace TCP fault proxy. This machine has no netem and Node has no toxiproxy server, so the
// link faults the durability tests need (partitions, half-open links, replies lost after a
// statement ran) are played here, between Sarsen and PostgreSQL or a fake provider.
import net from 'node:net';
import type { AddressInfo, Socket } from 'node:net';
import { track } from './resources.ts';

type NewConnections = 'blackhole' | 'refuse' | 'pass';

export type Fault =
  | { kind: 'pass' }
  | { kind: 'partition' }
  | { kind: 'half-open'; newConnections?: NewConnections }
  | { kind: 'lost-replies'; newConnections?: NewConnections }
  | { kind: 'refuse' }
  | { kind: 'reset' }
  | { kind: 'latency'; ms: number }
  | { kind: 'bandwidth'; bytesPerSecond: number }
  | { kind: 'execute-and-timeout'; match: string | Buffer; times?: number };

export type FaultProxy = {
  readonly port: number;
  set(fault: Fault): void;
  heal(): void;
  /** Connections open through the proxy now; forgotten, accepted and fired count since start. */
  stats(): { open: number; forgotten: number; accepted: number; fired: number };
  close(): Promise<void>;
};

/** One direction of one connection: what was read from `from` and is not yet written to `to`. */
type Pipe = {
  from: Socket;
  to: Socket;
  queue: { chunk: Buffer; at: number }[];
  bytes: number;
  freeAt: number; // when a paced link has sent what it already took
  timer?: NodeJS.Timeout;
  drop: boolean; // for good: the bytes are read and discarded
  eof?: 'end' | 'close' | 'error'; // what `from` did, to be done to `to` once the queue is out
  done?: 'end' | 'close' | 'error';
};

type Conn = { client: Socket; target: Socket; up: Pipe; down: Pipe; forgotten: boolean; connected: boolean; clientClosed: boolean; targetClosed: boolean; tail: Buffer };

// Past this many queued bytes the reader is paused, so a paced or partitioned link pushes back
// on the sender as TCP would instead of buffering without bound.
const HIGH_WATER = 64 * 1024;
// A paced link sends pieces worth 1/50 s, small enough for the rate to hold within a timer tick.
const PIECES_PER_SECOND = 50;
const EMPTY = Buffer.alloc(0);
const ignore = () => {};
const closeOf = (s: Socket) => new Promise((resolve) => s.once('close', resolve));

export async function startFaultProxy(target: { host: string; port: number }): Promise<FaultProxy> {
  let fault: Fault = { kind: 'pass' };
  let closing = false;
  let accepted = 0;
  let forgotten = 0;
  let fired = 0;
  let firedNow = 0; // under the current execute-and-timeout fault, against its `times`
  const conns = new Set<Conn>();
  const held = () => fault.kind === 'partition';

  function flow(p: Pipe) {
    // A forgotten direction keeps reading so the sender's writes never block: a dead network
    // swallows bytes, it does not push back.
    if (p.drop || (p.bytes < HIGH_WATER && !p.to.writableNeedDrain)) p.from.resume();
    else p.from.pause();
  }

  function deliver(p: Pipe) {
    const now = performance.now();
    while (p.queue.length > 0) {
      if (held() || p.to.writableNeedDrain) return; // heal() or 'drain' pumps again
      const head = p.queue[0];
      const rate = fault.kind === 'bandwidth' ? fault.bytesPerSecond : 0;
      const wait = Math.max(head.at, rate ? p.freeAt : 0) - now;
      if (wait > 0) {
        p.timer = setTimeout(() => {
          p.timer = undefined;
          pump(p);
        }, wait).unref();
        return;
      }
      let chunk = head.chunk;
      if (rate) {
        chunk = chunk.subarray(0, Math.max(1, Math.floor(rate / PIECES_PER_SECOND)));
        p.freeAt = Math.max(now, p.freeAt) + (chunk.length * 1000) / rate;
      }
      if (chunk.length === head.chunk.length) p.queue.shift();
      else head.chunk = head.chunk.subarray(chunk.length);
      p.bytes -= chunk.length;
      p.to.write(chunk);
    }
    // The FIN or reset travels behind the bytes sent before it, as on the wire.
    if (held() || !p.eof || p.eof === p.done || p.to.destroyed) return;
    p.done = p.eof;
    if (p.eof === 'end') p.to.end();
    else if (p.eof === 'close') p.to.end(() => p.to.destroy());
    else p.to.resetAndDestroy();
  }

  function pump(p: Pipe) {
    if (!p.drop && !p.timer && !closing) deliver(p);
    flow(p);
  }

  function take(p: Pipe, chunk: Buffer) {
    if (p.drop) return;
    p.queue.push({ chunk, at: fault.kind === 'latency' ? performance.now() + fault.ms : 0 });
    p.bytes += chunk.length;
    pump(p);
  }

  function stop(p: Pipe) {
    p.drop = true;
    p.queue = [];
    p.bytes = 0;
    clearTimeout(p.timer);
    p.timer = undefined;
    flow(p);
  }

  /** Drops the replies (and with `both` the requests too) for good; no socket is closed. */
  function forget(c: Conn, both: boolean) {
    if (!c.forgotten) forgotten++;
    c.forgotten = true;
    stop(c.down);
    if (both) stop(c.up);
  }

  function connect(c: Conn) {
    if (c.connected) return;
    c.connected = true;
    c.target.connect(target.port, target.host);
  }

  function watch(c: Conn, chunk: Buffer) {
    if (fault.kind !== 'execute-and-timeout' || c.forgotten || firedNow >= (fault.times ?? 1)) return;
    const match = typeof fault.match === 'string' ? Buffer.from(fault.match) : fault.match;
    // The match may straddle two reads, so the end of the previous one is kept.
    const hay = c.tail.length > 0 ? Buffer.concat([c.tail, chunk]) : chunk;
    if (hay.includes(match)) {
      firedNow++;
      fired++;
      c.tail = EMPTY;
      forget(c, false);
    } else {
      c.tail = Buffer.from(hay.subarray(Math.max(0, hay.length - match.length + 1)));
    }
  }

  function newConnections(): NewConnections {
    if (fault.kind === 'refuse') return 'refuse';
    if (fault.kind === 'half-open' || fault.kind === 'lost-replies') return fault.newConnections ?? 'blackhole';
    return 'pass';
  }

  function pipe(from: Socket, to: Socket): Pipe {
    const p: Pipe = { from, to, queue: [], bytes: 0, freeAt: 0, drop: false };
    to.on('drain', () => pump(p));
    return p;
  }

  const server = net.createServer({ allowHalfOpen: true, noDelay: true });
  server.on('connection', (client) => {
    accepted++;
    client.on('error', ignore);
    const policy = newConnections();
    if (closing || policy === 'refuse') return void client.resetAndDestroy();
    // Half-open sockets so a FIN is passed on as a FIN rather than answered by Node itself.
    const sock = new net.Socket({ allowHalfOpen: true }).setNoDelay(true);
    sock.on('error', ignore);
    const c: Conn = { client, target: sock, up: pipe(client, sock), down: pipe(sock, client), forgotten: false, connected: false, clientClosed: false, targetClosed: false, tail: EMPTY };
    conns.add(c);
    for (const [p, back] of [[c.up, c.down], [c.down, c.up]] as const) {
      p.from.on('data', (chunk: Buffer) => {
        if (p === c.up) watch(c, chunk);
        take(p, chunk);
      });
      p.from.on('end', () => {
        p.eof ??= 'end';
        pump(p);
      });
      p.from.on('close', (hadError?: boolean) => {
        if (p === c.up) c.clientClosed = true;
        else c.targetClosed = true;
        stop(back); // nothing can be written to a closed socket; what the other side sends is lost
        p.eof = hadError ? 'error' : 'close';
        pump(p);
        if (c.clientClosed && (c.targetClosed || (!c.connected && c.up.drop))) conns.delete(c);
      });
    }
    if (policy === 'blackhole') forget(c, true); // the target never hears of it
    else if (!held()) connect(c); // under a partition the target hears of it on heal
  });
  server.on('error', ignore);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const untrack = track('server', `fault proxy :${port} -> ${target.host}:${target.port}`);
  let closed: Promise<void> | undefined;

  const proxy: FaultProxy = {
    port,
    set(next) {
      const wasHeld = held();
      fault = next;
      firedNow = 0;
      for (const c of [...conns]) {
        c.tail = EMPTY;
        if (next.kind === 'half-open') forget(c, true);
        else if (next.kind === 'lost-replies') forget(c, false);
        else if (next.kind === 'reset' && !c.forgotten) {
          stop(c.up);
          stop(c.down);
          c.client.resetAndDestroy();
          if (c.connected) c.target.resetAndDestroy();
          else c.target.destroy();
        }
        if (wasHeld && !held()) {
          if (!c.up.drop) connect(c);
          pump(c.up);
          pump(c.down);
        }
      }
    },
    heal() {
      proxy.set({ kind: 'pass' });
    },
    stats() {
      return { open: conns.size, forgotten, accepted, fired };
    },
    close() {
      closed ??= (async () => {
        closing = true;
        const waits: Promise<unknown>[] = [new Promise((resolve) => server.close(resolve))];
        for (const c of conns) {
          for (const p of [c.up, c.down]) clearTimeout(p.timer);
          if (!c.clientClosed) waits.push(closeOf(c.client));
          if (!c.targetClosed) waits.push(closeOf(c.target));
          c.client.destroy();
          c.target.destroy();
        }
        conns.clear();
        await Promise.all(waits);
        untrack();
      })();
      return closed;
    },
  };
  return proxy;
}
