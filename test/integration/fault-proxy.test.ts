// The userspace fault proxy (test/support/fault-proxy.ts), mode by mode over real sockets: a
// small net.Server behind it stands for PostgreSQL or a provider, and each check looks at what
// both ends actually received, so a mode that leaked, dropped or reordered bytes would fail.
import { expect } from 'chai';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { startFaultProxy, type FaultProxy } from '../support/fault-proxy.ts';

/** One end of a connection as a test sees it: everything it read and how it ended. */
type Peer = { socket: net.Socket; data: Buffer[]; at: number[]; text(): string; bytes(): number; connected: boolean; ended: boolean; closed: boolean; error?: NodeJS.ErrnoException };

function watch(socket: net.Socket): Peer {
  const peer: Peer = {
    socket,
    data: [],
    at: [], // when each of data arrived
    text: () => Buffer.concat(peer.data).toString(),
    bytes: () => peer.data.reduce((n, b) => n + b.length, 0),
    connected: false,
    ended: false,
    closed: false,
  };
  socket.on('connect', () => (peer.connected = true));
  socket.on('data', (d: Buffer) => {
    peer.data.push(d);
    peer.at.push(performance.now());
  });
  socket.on('end', () => (peer.ended = true));
  socket.on('close', () => (peer.closed = true));
  socket.on('error', (e) => (peer.error = e));
  return peer;
}

type Target = { port: number; peers: Peer[]; statements: string[]; close(): Promise<void> };

/** echo: writes back what it reads; lines: answers each line `ok:<line>` and records it; silent: only reads. */
async function startTarget(mode: 'echo' | 'lines' | 'silent'): Promise<Target> {
  const peers: Peer[] = [];
  const statements: string[] = [];
  const server = net.createServer((socket) => {
    const peer = watch(socket);
    peer.connected = true;
    peers.push(peer);
    let pending = '';
    socket.on('data', (d: Buffer) => {
      if (mode === 'echo') socket.write(d);
      if (mode !== 'lines') return;
      pending += d.toString();
      for (let i = pending.indexOf('\n'); i >= 0; i = pending.indexOf('\n')) {
        const line = pending.slice(0, i);
        pending = pending.slice(i + 1);
        statements.push(line);
        socket.write(`ok:${line}\n`);
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    peers,
    statements,
    async close() {
      for (const p of peers) p.socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

async function waitFor(what: string, pred: () => boolean, timeoutMs = 5_000): Promise<void> {
  const until = performance.now() + timeoutMs;
  while (!pred()) {
    if (performance.now() > until) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

/** Whether the whole of `data` left the socket (was taken by the kernel) within `ms`. */
function flushed(socket: net.Socket, data: Buffer, ms = 10_000): Promise<boolean> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms);
    socket.write(data, (err) => {
      clearTimeout(timer);
      resolve(!err);
    });
  });
}

// Long enough that a byte the proxy wrongly let through on loopback would have arrived.
const QUIET_MS = 300;
const BIG = 32 * 1024 * 1024; // more than loopback's kernel buffers hold, so only a reader drains it

describe('fault proxy (test/support/fault-proxy.ts)', function () {
  this.timeout(30_000);
  let target: Target | undefined;
  let proxy: FaultProxy | undefined;
  const clients: Peer[] = [];

  async function setup(mode: 'echo' | 'lines' | 'silent'): Promise<{ t: Target; p: FaultProxy }> {
    target = await startTarget(mode);
    proxy = await startFaultProxy({ host: '127.0.0.1', port: target.port });
    return { t: target, p: proxy };
  }

  function dial(): Peer {
    const peer = watch(net.connect(proxy!.port, '127.0.0.1'));
    clients.push(peer);
    return peer;
  }

  async function open(): Promise<Peer> {
    const peer = dial();
    await waitFor('the client to connect', () => peer.connected);
    return peer;
  }

  async function roundTrip(peer: Peer, text: string): Promise<void> {
    const before = peer.text();
    peer.socket.write(text);
    await waitFor(`the echo of ${text}`, () => peer.text() === before + text);
  }

  afterEach(async () => {
    for (const c of clients.splice(0)) c.socket.destroy();
    await proxy?.close();
    await target?.close();
    proxy = undefined;
    target = undefined;
  });

  it('pass: forwards bytes both ways, and a FIN or a reset on either side reaches the other', async () => {
    const { t, p } = await setup('echo');
    const a = await open();
    await roundTrip(a, 'hello');
    expect(p.stats()).to.deep.equal({ open: 1, forgotten: 0, accepted: 1, fired: 0 });
    a.socket.end();
    await waitFor('the FIN at the target, and the target FIN back at the client', () => t.peers[0].ended && a.ended);

    const b = await open();
    await waitFor('the second target connection', () => t.peers.length === 2);
    t.peers[1].socket.resetAndDestroy();
    await waitFor('the reset at the client', () => b.closed);
    expect(b.error?.code).to.equal('ECONNRESET');

    const c = await open();
    await roundTrip(c, 'x');
    c.socket.resetAndDestroy();
    await waitFor('the reset at the target', () => t.peers[2].closed);
    expect(t.peers[2].error?.code).to.equal('ECONNRESET');
    await waitFor('no connection left open', () => p.stats().open === 0);
  });

  it('partition: holds bytes both ways on open and new connections; heal delivers them in order and the link works again', async () => {
    const { t, p } = await setup('echo');
    const a = await open();
    await roundTrip(a, 'a;');
    p.set({ kind: 'partition' });
    const sent: string[] = [];
    for (let i = 0; i < 200; i++) {
      sent.push(`m${i};`);
      a.socket.write(`m${i};`);
      if (i % 20 === 0) await sleep(1); // several reads, not one coalesced chunk
    }
    t.peers[0].socket.write('push;');
    const b = await open(); // accepted although partitioned
    b.socket.write('from-b;');
    await sleep(QUIET_MS);
    expect(t.peers[0].text()).to.equal('a;');
    expect(a.text()).to.equal('a;');
    expect(t.peers).to.have.length(1); // the target has not heard of b
    expect(b.bytes()).to.equal(0);
    expect(a.closed || b.closed).to.equal(false);
    expect(p.stats()).to.include({ open: 2, forgotten: 0 });

    p.heal();
    const expected = 'a;' + 'push;' + sent.join('');
    await waitFor('everything held, echoed back', () => a.text().length >= expected.length);
    expect(a.text()).to.equal(expected);
    expect(t.peers[0].text()).to.equal('a;' + sent.join(''));
    await waitFor('b held bytes echoed', () => b.text() === 'from-b;');
    await roundTrip(a, 'after;');
    await roundTrip(b, 'after;');
  });

  it('half-open: open connections go silent for good, writes still succeed, nothing is closed; new ones are blackholed', async () => {
    const { t, p } = await setup('echo');
    const a = await open();
    await roundTrip(a, 'a');
    p.set({ kind: 'half-open' });
    a.socket.write('lost');
    // Both ends can keep writing: the proxy reads and discards what a dead link swallows.
    expect(await flushed(a.socket, Buffer.alloc(BIG)), 'client write of 32 MiB').to.equal(true);
    expect(await flushed(t.peers[0].socket, Buffer.alloc(BIG)), 'target write of 32 MiB').to.equal(true);
    const b = await open(); // accepted, then nothing
    b.socket.write('from-b');
    p.heal(); // does not revive them
    a.socket.write('after-heal');
    b.socket.write('after-heal');
    a.socket.end(); // even a FIN is lost
    await sleep(QUIET_MS);

    expect(t.peers).to.have.length(1);
    expect(t.peers[0].text()).to.equal('a');
    expect(t.peers[0]).to.include({ ended: false, closed: false });
    expect(a.text()).to.equal('a');
    expect(a).to.include({ ended: false, closed: false });
    expect(b.bytes()).to.equal(0);
    expect(b).to.include({ ended: false, closed: false });
    expect([a.error, b.error]).to.deep.equal([undefined, undefined]);
    expect(p.stats()).to.deep.equal({ open: 2, forgotten: 2, accepted: 2, fired: 0 });

    const c = await open(); // after heal, new connections pass
    await roundTrip(c, 'fresh');
  });

  it("half-open's newConnections: 'refuse' destroys them at once, 'pass' lets them through", async () => {
    const { t, p } = await setup('echo');
    p.set({ kind: 'half-open', newConnections: 'refuse' });
    const a = dial();
    await waitFor('the refused client to close', () => a.closed);
    p.set({ kind: 'half-open', newConnections: 'pass' });
    const b = await open();
    await roundTrip(b, 'through');
    expect(t.peers).to.have.length(1);
    p.set({ kind: 'half-open', newConnections: 'pass' }); // b was open now: forgotten
    b.socket.write('lost');
    await sleep(QUIET_MS);
    expect(b.text()).to.equal('through');
    expect(t.peers[0].text()).to.equal('through');
  });

  it('lost-replies: requests still reach the target and run, replies (and its FIN) never reach the client, for good', async () => {
    const { t, p } = await setup('lines');
    const a = await open();
    a.socket.write('Q1\n');
    await waitFor('the first answer', () => a.text() === 'ok:Q1\n');
    p.set({ kind: 'lost-replies', newConnections: 'pass' });
    a.socket.write('COMMIT\n');
    await waitFor('COMMIT at the target', () => t.statements.includes('COMMIT'));
    const b = await open();
    b.socket.write('Q2\n');
    await waitFor('the answer on a new connection', () => b.text() === 'ok:Q2\n');
    p.heal();
    a.socket.write('Q3\n');
    await waitFor('Q3 at the target after heal', () => t.statements.includes('Q3'));
    t.peers[0].socket.destroy(); // the target's FIN is lost too
    await sleep(QUIET_MS);
    expect(t.statements).to.deep.equal(['Q1', 'COMMIT', 'Q2', 'Q3']);
    expect(a.text()).to.equal('ok:Q1\n');
    expect(a).to.include({ ended: false, closed: false });
    expect(a.error).to.equal(undefined);
    expect(await flushed(a.socket, Buffer.from('still writable\n'))).to.equal(true);
    expect(p.stats()).to.include({ forgotten: 1, accepted: 2 });

    p.set({ kind: 'lost-replies' }); // new connections blackholed by default
    const c = await open();
    c.socket.write('Q4\n');
    await sleep(QUIET_MS);
    expect(t.statements).to.not.include('Q4');
    expect(t.peers).to.have.length(2);
    expect(c).to.include({ closed: false });
  });

  it('refuse: new connections are destroyed before the target hears of them; open ones keep working', async () => {
    const { t, p } = await setup('echo');
    const a = await open();
    await roundTrip(a, 'one');
    p.set({ kind: 'refuse' });
    const b = dial();
    await waitFor('the refused client to close', () => b.closed);
    await roundTrip(a, 'two');
    expect(t.peers).to.have.length(1);
    p.heal();
    const c = await open();
    await roundTrip(c, 'three');
    expect(p.stats()).to.include({ accepted: 3, open: 2 });
  });

  it('reset: every open connection is reset on both sides, then new ones pass', async () => {
    const { t, p } = await setup('echo');
    const a = await open();
    const b = await open();
    await roundTrip(a, 'a');
    await roundTrip(b, 'b');
    p.set({ kind: 'reset' });
    await waitFor('both clients reset', () => a.closed && b.closed);
    await waitFor('both target sockets reset', () => t.peers.every((x) => x.closed));
    for (const peer of [a, b, ...t.peers]) expect(peer.error?.code).to.equal('ECONNRESET');
    const c = await open();
    await roundTrip(c, 'c');
    expect(p.stats()).to.include({ open: 1, accepted: 3 });
  });

  it('latency: every chunk is delayed in each direction, in order', async () => {
    const { t, p } = await setup('echo');
    const a = await open();
    await roundTrip(a, 'warm;');
    p.set({ kind: 'latency', ms: 150 });
    const started = performance.now();
    await roundTrip(a, 'ping;');
    expect(performance.now() - started).to.be.at.least(290); // 150 ms out and 150 ms back
    const sent: { text: string; at: number }[] = [];
    for (let i = 0; i < 20; i++) {
      sent.push({ text: `n${i};`, at: performance.now() });
      a.socket.write(`n${i};`);
      await sleep(5);
    }
    const all = sent.map((x) => x.text).join('');
    await waitFor('all chunks echoed', () => a.text().length === 'warm;ping;'.length + all.length);
    expect(a.text()).to.equal('warm;ping;' + all);
    // Each chunk reached the target no sooner than 150 ms after it was written.
    const target = t.peers[0];
    let end = 'warm;ping;'.length;
    for (const chunk of sent) {
      end += chunk.text.length;
      let have = 0;
      const i = target.data.findIndex((d) => (have += d.length) >= end);
      expect(target.at[i] - chunk.at, chunk.text).to.be.at.least(145);
    }
  });

  it('bandwidth: each direction is paced to the rate', async () => {
    const { t, p } = await setup('silent');
    const a = await open();
    await waitFor('the target connection', () => t.peers.length === 1);
    p.set({ kind: 'bandwidth', bytesPerSecond: 3000 });
    const up = randomBytes(3000);
    let started = performance.now();
    a.socket.write(up);
    await sleep(400);
    expect(t.peers[0].bytes()).to.be.below(2500); // about 1200 by now
    await waitFor('all bytes at the target', () => t.peers[0].bytes() === up.length);
    expect(performance.now() - started).to.be.at.least(800);
    expect(Buffer.concat(t.peers[0].data).equals(up)).to.equal(true);

    const down = randomBytes(3000);
    started = performance.now();
    t.peers[0].socket.write(down);
    await waitFor('all bytes at the client', () => a.bytes() === down.length);
    expect(performance.now() - started).to.be.at.least(800);
    expect(Buffer.concat(a.data).equals(down)).to.equal(true);
  });

  it('execute-and-timeout: the matching statement and all after it reach the target, its replies are lost; one connection only', async () => {
    const { t, p } = await setup('lines');
    const [a, b] = [await open(), await open()];
    p.set({ kind: 'execute-and-timeout', match: 'COMMIT' });
    a.socket.write('SELECT\n');
    await waitFor('the answer before the match', () => a.text() === 'ok:SELECT\n');
    // The match straddles two reads of the proxy: the first half reaches the target alone.
    a.socket.write('COM');
    await waitFor('the first half at the target', () => t.peers[0].text().endsWith('COM'));
    a.socket.write('MIT\n');
    a.socket.write('AFTER\n');
    await waitFor('COMMIT and AFTER run', () => t.statements.includes('AFTER'));
    b.socket.write('COMMIT\n'); // it fired once already: passes
    await waitFor("b's answer", () => b.text() === 'ok:COMMIT\n');
    p.heal();
    a.socket.write('HEALED\n');
    await waitFor('HEALED at the target', () => t.statements.includes('HEALED'));
    await sleep(QUIET_MS);
    expect(t.statements).to.deep.equal(['SELECT', 'COMMIT', 'AFTER', 'COMMIT', 'HEALED']);
    expect(a.text()).to.equal('ok:SELECT\n');
    expect(a).to.include({ ended: false, closed: false });
    expect(p.stats()).to.include({ fired: 1, forgotten: 1, open: 2 });
  });

  it('execute-and-timeout with a Buffer match fires on `times` connections', async () => {
    const { t, p } = await setup('lines');
    const peers = [await open(), await open(), await open()];
    p.set({ kind: 'execute-and-timeout', match: Buffer.from('X'), times: 2 });
    for (const peer of peers) peer.socket.write('X\n');
    await waitFor('three X at the target', () => t.statements.length === 3);
    await waitFor('one answer', () => peers.some((x) => x.text() === 'ok:X\n'));
    await sleep(QUIET_MS);
    expect(peers.filter((x) => x.text() === 'ok:X\n')).to.have.length(1);
    expect(p.stats()).to.include({ fired: 2, forgotten: 2 });
  });

  it('close(): destroys every socket, forgotten ones included, clears pending delays and stops listening', async () => {
    const { t, p } = await setup('echo');
    const a = await open();
    await roundTrip(a, 'a');
    p.set({ kind: 'half-open' });
    const b = await open(); // blackholed
    p.set({ kind: 'latency', ms: 60_000 });
    const c = await open();
    c.socket.write('queued behind a minute');
    await waitFor('c at the target', () => t.peers.length === 2);
    await p.close();
    await waitFor('every client closed', () => [a, b, c].every((x) => x.closed));
    await waitFor('every target socket closed', () => t.peers.every((x) => x.closed));
    expect(t.peers[1].bytes()).to.equal(0);
    const d = dial();
    await waitFor('the refused dial', () => d.closed);
    expect(d.error?.code).to.equal('ECONNREFUSED');
  });
});
