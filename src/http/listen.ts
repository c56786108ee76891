// Binding a listener: a process serving on its own, or the primary of `--processes`.
import type net from 'node:net';
import type { AddressInfo } from 'node:net';

/** Listens on `host:port` (0: any free port); answers the listener's `http://host:port`. */
export async function listen(server: net.Server, port: number, host: string): Promise<string> {
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    // A deep accept queue (the kernel caps it at somaxconn): a burst of callers opening
    // streams at once must not wait out SYN retransmissions.
    server.listen({ port, host, backlog: 4096 }, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const bound = (server.address() as AddressInfo).port;
  return `http://${host.includes(':') ? `[${host}]` : host}:${bound}`;
}
