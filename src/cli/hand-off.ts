// How the primary of `--processes` shares its port: it accepts every connection and hands it to
// the next ready worker in turn, so a few long-lived connections (keep-alive clients, thousands
// of streams) spread evenly, which the kernel's choice between processes waiting on one socket
// does not. The primary keeps its own copy of a connection open until the worker says it has
// it: a worker that dies with connections on their way does not take them down, they go to
// the next one. (Node's own round-robin scheduling loses such a connection: its caller waits
// for an answer that never comes.)
import type net from 'node:net';
import { createServer } from 'node:net';
import type { Worker } from 'node:cluster';
import { listen } from '../http/listen.ts';

/** To a worker, with the connection. */
export type Connection = Readonly<{ type: 'sarsen:connection'; id: number }>;
/** From the worker, once the connection is its own. */
export type Taken = Readonly<{ type: 'sarsen:taken'; id: number }>;

export type HandOff = {
  /** The listener's `http://host:port`. */
  url: string;
  /** A worker ready to serve: connections waiting for one go to it. */
  add(worker: Worker): void;
  /** A worker that is gone: what it had not taken yet goes to another. */
  remove(worker: Worker): void;
  /** The worker's `Taken` message. */
  taken(message: Taken): void;
  /** Accepts nothing more; closes what no worker has. */
  close(): void;
};

/** Listens on `host:port`; throws as `listen` does (EADDRINUSE) before any worker starts. */
export async function startHandOff(port: number, host: string): Promise<HandOff> {
  const ready: Worker[] = [];
  const waiting: net.Socket[] = []; // accepted while no worker was ready
  const onTheirWay = new Map<number, { socket: net.Socket; worker: Worker }>();
  let turn = 0;
  let lastId = 0;
  let closed = false;

  const give = (socket: net.Socket): void => {
    if (closed) return void socket.destroy();
    const worker = ready.length === 0 ? undefined : ready[turn++ % ready.length]!;
    if (!worker) return void waiting.push(socket);
    const id = ++lastId;
    onTheirWay.set(id, { socket, worker });
    // A failed send is the worker's channel closing: its exit hands the connection on.
    worker.send({ type: 'sarsen:connection', id } satisfies Connection, socket, { keepOpen: true }, () => {});
  };
  // Paused: the bytes a caller sends wait in the kernel for the worker that reads them.
  const server = createServer({ pauseOnConnect: true }, give);
  const url = await listen(server, port, host);

  return {
    url,
    add(worker) {
      ready.push(worker);
      for (const socket of waiting.splice(0)) give(socket);
    },
    remove(worker) {
      const at = ready.indexOf(worker);
      if (at !== -1) ready.splice(at, 1);
      for (const [id, way] of onTheirWay) {
        if (way.worker !== worker) continue;
        onTheirWay.delete(id);
        give(way.socket);
      }
    },
    taken({ id }) {
      // The worker holds its own descriptor: closing this one leaves the connection open.
      onTheirWay.get(id)?.socket.destroy();
      onTheirWay.delete(id);
    },
    close() {
      closed = true;
      server.close();
      for (const socket of waiting.splice(0)) socket.destroy();
    },
  };
}
