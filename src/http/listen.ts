// Binding a listener: a process serving on its own, or the primary of `--processes`.
import net from 'node:net';
import type { AddressInfo } from 'node:net';

// A deep accept queue (the kernel caps it at somaxconn): a burst of callers opening streams at
// once must not wait out SYN retransmissions.
const BACKLOG = 4096;

/**
 * Listening sockets a serving process shares its port among. libuv accepts one connection per
 * turn of the event loop from each listening socket, so a process busy with thousands of
 * streams (turns of tens of milliseconds) took new callers in at a few dozen a second while
 * they queued in the kernel (docs/performance.md "Costs measured in isolation"). Each socket
 * adds an accept per turn; the kernel spreads connections over them.
 */
export const ACCEPTORS = 16;

/** Listens on `host:port` (0: any free port); answers the listener's `http://host:port`. */
export async function listen(server: net.Server, port: number, host: string, opts: { reusePort?: boolean } = {}): Promise<string> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ port, host, backlog: BACKLOG, ...(opts.reusePort ? { reusePort: true } : {}) }, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const bound = (server.address() as AddressInfo).port;
  return `http://${host.includes(':') ? `[${host}]` : host}:${bound}`;
}

export type Listening = {
  url: string;
  /** Stops accepting on every socket (connections already accepted carry on); once is enough. */
  close(): void;
};

/**
 * Listens for `server` on `host:port` through `acceptors` sockets sharing the port
 * (SO_REUSEPORT), each handing what it accepts to `server`. The port is still this process's
 * alone: taken by anyone, it fails with EADDRINUSE as a single socket would. Where the
 * platform cannot share a port, one socket.
 */
export async function listenShared(server: net.Server, port: number, host: string, acceptors = ACCEPTORS): Promise<Listening> {
  // Sockets that share a port join any other process's that does: see first that none holds it.
  if (port !== 0) {
    const probe = net.createServer();
    await listen(probe, port, host);
    await new Promise((resolve) => probe.close(resolve));
  }
  let url: string;
  try {
    url = await listen(server, port, host, { reusePort: acceptors > 1 });
  } catch (err) {
    if (acceptors <= 1 || (err as NodeJS.ErrnoException).code === 'EADDRINUSE' || (err as NodeJS.ErrnoException).code === 'EACCES') throw err;
    url = await listen(server, port, host); // the platform has no SO_REUSEPORT
    acceptors = 1;
  }
  const bound = (server.address() as AddressInfo).port;
  const extra: net.Server[] = [];
  try {
    for (let i = 1; i < acceptors; i++) {
      const acceptor = net.createServer((socket) => server.emit('connection', socket));
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
    close() {
      if (!open) return;
      open = false;
      if (server.listening) server.close();
      for (const acceptor of extra) acceptor.close();
    },
  };
}
