// A serving process's listener (src/http/listen.ts): under a busy event loop it still takes a
// burst of connections in within a few turns, each set up as http.Server sets up its own, and its
// port stays its own.
import { expect } from 'chai';
import net from 'node:net';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { listenShared, ACCEPTORS } from '../../src/http/listen.ts';

const BURST = 200;

/** Turns of a busy event loop (each spins a few ms, as one busy with thousands of streams does) until `done`. */
function busyTurns(done: () => boolean): Promise<number> {
  return new Promise((resolve) => {
    let turns = 0;
    const spin = () => {
      if (done()) return resolve(turns);
      turns++;
      const until = performance.now() + 3;
      while (performance.now() < until);
      setImmediate(spin);
    };
    setImmediate(spin);
  });
}

function connect(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1', () => resolve(socket));
    socket.once('error', reject);
  });
}

const portOf = (url: string) => Number(new URL(url).port);

describe('listening (src/http/listen.ts)', function () {
  this.timeout(30_000);
  const servers: http.Server[] = [];
  const closers: (() => void)[] = [];
  const sockets: net.Socket[] = [];
  afterEach(async () => {
    for (const s of sockets.splice(0)) s.destroy();
    for (const close of closers.splice(0)) close();
    for (const s of servers.splice(0)) s.closeAllConnections();
  });

  const serve = async (port = 0) => {
    const server = http.createServer((_req, res) => res.end('ok'));
    servers.push(server);
    const listening = await listenShared(server, port, '127.0.0.1');
    closers.push(() => listening.close());
    return { server, listening };
  };

  it(`takes a burst of ${BURST} connections in within a few busy turns, not one a turn`, async () => {
    const { server, listening } = await serve();
    let accepted = 0;
    server.on('connection', () => accepted++);
    // The connections complete in the kernel at once and wait in the accept queues.
    sockets.push(...(await Promise.all(Array.from({ length: BURST }, () => connect(portOf(listening.url))))));
    const turns = await busyTurns(() => accepted === BURST);
    // One listening socket takes one connection a turn: BURST turns at least. The kernel spreads
    // the burst over ACCEPTORS sockets, unevenly: a few times BURST / ACCEPTORS.
    expect(turns, `${accepted} accepted in ${turns} turns`).to.be.below(BURST / 2);
  });

  it('answers connections whichever of its sockets the kernel gives them to', async () => {
    const { listening } = await serve();
    const answers = await Promise.all(
      Array.from({ length: ACCEPTORS * 4 }, () =>
        fetch(listening.url, { headers: { connection: 'close' } }).then((r) => r.text()),
      ),
    );
    expect(answers).to.deep.equal(Array(ACCEPTORS * 4).fill('ok'));
  });

  it("sets up what every socket accepts as http.Server does its own: Nagle's algorithm off", async () => {
    // (Node applies a listening socket's noDelay to each connection it accepts, before any
    // 'connection' listener runs. Without it, Nagle's algorithm held a stream's second frame
    // until the caller's delayed ACK of the first.)
    const { server, listening } = await serve();
    const noDelay = (s: net.Server) => (s as net.Server & { noDelay?: boolean }).noDelay;
    expect(noDelay(server), 'http.Server itself').to.equal(true);
    expect(listening.sockets).to.have.length(ACCEPTORS);
    expect(listening.sockets.map(noDelay)).to.deep.equal(Array(ACCEPTORS).fill(true));
  });

  it('fails with EADDRINUSE when the port is taken, by a plain socket or by another shared listener', async () => {
    const plain = net.createServer();
    await new Promise<void>((resolve) => plain.listen(0, '127.0.0.1', resolve));
    try {
      const err = await serve((plain.address() as AddressInfo).port).catch((e: NodeJS.ErrnoException) => e);
      expect((err as NodeJS.ErrnoException).code).to.equal('EADDRINUSE');
    } finally {
      await new Promise((resolve) => plain.close(resolve));
    }
    const first = await serve();
    const err = await serve(portOf(first.listening.url)).catch((e: NodeJS.ErrnoException) => e);
    expect((err as NodeJS.ErrnoException).code).to.equal('EADDRINUSE');
  });

  it('accepts nothing more once closed, on any of its sockets', async () => {
    const { listening } = await serve();
    const port = portOf(listening.url);
    listening.close();
    const refused = await Promise.all(
      Array.from({ length: ACCEPTORS * 4 }, () => connect(port).then((s) => (sockets.push(s), 'connected'), (e: NodeJS.ErrnoException) => e.code)),
    );
    expect(new Set(refused)).to.deep.equal(new Set(['ECONNREFUSED']));
  });
});
