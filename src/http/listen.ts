// Binding a listener: a process serving on its own, or a worker of `--processes`.
import net from 'node:net';
import type { AddressInfo } from 'node:net';

// A deep accept queue (the kernel caps it at somaxconn): a burst of callers opening streams at
// once must not wait out SYN retransmissions.
const BACKLOG = 4096;

/**
 * Listening sockets a serving process shares its port among. libuv accepts one connection per
 * turn of the event loop from each listening socket, so a process busy with thousands of
 * streams (turns of tens of milliseconds) took new callers in at a few dozen a second while
 * they queued in the kernel (docs/measurements.md "Costs measured in isolation"). Each socket
 * adds an accept per turn; the kernel spreads connections over them.
 */
export const ACCEPTORS = 16;

/** Listens on `host:port` (0: any free port); answers the listener's `http://host:port`. */
export async function listen(server: net.Server, port: number, host: string, opts: { reusePort?: boolean } = {}): Promise<string> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    // Exclusive: a worker of `--processes` binds its own sockets instead of asking node:cluster's
    // primary for one.
    server.listen({ port, host, backlog: BACKLOG, exclusive: true, ...(opts.reusePort ? { reusePort: true } : {}) }, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const bound = (server.address() as AddressInfo).port;
  return `http://${host.includes(':') ? `[${host}]` : host}:${bound}`;
}

export type Listening = {
  url: string;
  /** Every socket accepting for the listener: `server` itself and the ones beside it. */
  sockets: readonly net.Server[];
  /** Stops accepting on every socket (connections already accepted carry on); once is enough. */
  close(): void;
};

/**
 * Binds `host:port` (0: any free port) with a plain socket and lets it go: a port that anyone
 * holds fails here with EADDRINUSE. Answers the port and its URL, for sockets that share it.
 */
export async function claimPort(port: number, host: string): Promise<{ port: number; url: string }> {
  const probe = net.createServer();
  const url = await listen(probe, port, host);
  const bound = (probe.address() as AddressInfo).port;
  await new Promise((resolve) => probe.close(resolve));
  return { port: bound, url };
}

/** Whether this platform lets sockets share a port (Node refuses `reusePort` where it cannot). */
export async function canSharePort(host: string): Promise<boolean> {
  const probe = net.createServer();
  try {
    await listen(probe, 0, host, { reusePort: true });
    await new Promise((resolve) => probe.close(resolve));
    return true;
  } catch (err) {
    // The host itself cannot be bound: that is for the listener's own bind to report.
    if (['EADDRNOTAVAIL', 'EACCES', 'ENOTFOUND', 'EAI_AGAIN'].includes((err as NodeJS.ErrnoException).code ?? '')) throw err;
    return false;
  }
}

/**
 * Listens for `server` on `host:port` through ACCEPTORS sockets sharing the port
 * (SO_REUSEPORT), each handing what it accepts to `server`. The port is still this process's
 * alone: taken by anyone, it fails with EADDRINUSE as a single socket would. With `joins`, the
 * port was claimed by the primary of `--processes` and its workers' sockets share it with each
 * other. Where the platform cannot share a port, one socket (and a lone worker).
 */
export async function listenShared(server: net.Server, port: number, host: string, opts: { joins?: boolean } = {}): Promise<Listening> {
  // Sockets that share a port join any other process's that does: see first that none holds it.
  if (port !== 0 && !opts.joins) await claimPort(port, host);
  const shares = await canSharePort(host);
  const acceptors = shares ? ACCEPTORS : 1;
  const url = await listen(server, port, host, { reusePort: shares });
  const bound = (server.address() as AddressInfo).port;
  const extra: net.Server[] = [];
  try {
    for (let i = 1; i < acceptors; i++) {
      // Set up as http.Server sets up what it accepts itself: Nagle's algorithm off. Left on, a
      // stream's second frame waited for the caller's delayed ACK of the first, up to 40 ms
      // (docs/measurements.md "Costs measured in isolation").
      const acceptor = net.createServer({ noDelay: true }, (socket) => server.emit('connection', socket));
      await listen(acceptor, bound, host, { reusePort: true });
      extra.push(acceptor);
    }
  } catch (err) {
    for (const acceptor of extra) acceptor.close();
    server.close();
    throw err;
  }
  let open = true;
  return {
    url,
    sockets: [server, ...extra],
    close() {
      if (!open) return;
      open = false;
      if (server.listening) server.close();
      for (const acceptor of extra) acceptor.close();
    },
  };
}
