// The watch's modes and their transitions (src/http/service/watch.ts), driven by news handed
// over in memory: a watch of a request this process just accepted reads nothing from the
// database until something says it must, so these paths need none (the pool here refuses every
// query). What the database adds (resume points, pages, state reads) is the replay and
// streaming integration tests'.
import { expect } from 'chai';
import { Watch, type Mode, type WatchEvent } from '../../src/http/service/watch.ts';
import type { BaseDeps } from '../../src/deps.ts';
import type { RequestEvent } from '../../src/db/events.ts';
import type { Answer, ChunkRow } from '../../src/db/requests.ts';

const ID = 'req_01JWATCH000000000000000000';

/** The bus as a watch uses it: news for one request, handed over at once. */
function memoryBus() {
  let handler: ((ev: RequestEvent) => void) | null = null;
  return {
    bus: {
      onRequest: (_id: string, h: (ev: RequestEvent) => void) => {
        handler = h;
        return () => (handler = null);
      },
      onReconnect: () => () => {},
    },
    send: (ev: RequestEvent) => handler?.(ev),
    listening: () => handler !== null,
  };
}

const frames = (attempt: number, from: number, to: number): ChunkRow[] =>
  Array.from({ length: to - from + 1 }, (_, i) => ({ seq: from + i, attempt, frame: Buffer.from(`data: ${from + i}\n\n`) }));
const framesEvent = (rows: ChunkRow[]): RequestEvent => ({ type: 'frames', requestId: ID, seq: rows.at(-1)!.seq, frames: rows });
const ANSWER: Answer = { status: 'succeeded', httpStatus: 200, contentType: 'text/event-stream', body: Buffer.alloc(0), errorStatus: null, retryAfter: null };
const answered: RequestEvent = { type: 'state', requestId: ID, status: 'succeeded', answer: ANSWER };

const seqs = (ev: WatchEvent | undefined) => (ev?.type === 'frames' ? ev.frames.map((f) => f.seq) : ev?.type);
/**
 * Lets pending callbacks run, so a watch that has nothing to do reaches its wait. (News is sent
 * only once a `next()` started the watch: a generator's body, which subscribes, runs from the first.)
 */
const settle = () => new Promise((resolve) => setImmediate(resolve));

function start(opts: { streaming?: boolean; idleMs?: number } = {}) {
  const { bus, send, listening } = memoryBus();
  const pool = { query: () => Promise.reject(new Error('this watch read the database')) };
  const left = new AbortController();
  const deps = { bus, pool } as unknown as BaseDeps;
  const w = new Watch(deps, { id: ID, namespaceId: 'ns_test', streaming: opts.streaming ?? true }, {
    afterSeq: 0,
    idleMs: opts.idleMs ?? 60_000,
    signal: left.signal,
    fresh: true,
  });
  const events = w.events();
  const modes: Mode[] = [];
  const next = async () => {
    const got = await events.next();
    modes.push(w.mode);
    return got.done ? undefined : got.value;
  };
  return { w, events, next, send, left, listening, modes };
}

describe('watch: each mode chooses the next', () => {
  it('following → checking → waiting while the stream runs; news wakes it; the answer settles it', async () => {
    const t = start();
    const first = t.next();
    await settle();
    expect(t.w.mode).to.equal('waiting', 'nothing at hand: it sleeps');
    t.send(framesEvent(frames(1, 1, 2)));
    expect(seqs(await first)).to.deep.equal([1, 2]);
    expect(t.w.mode).to.equal('checking', 'it decides after the caller took the frames');

    const second = t.next();
    await settle();
    expect(t.w.mode).to.equal('waiting');
    t.send(framesEvent(frames(1, 3, 3)));
    expect(seqs(await second)).to.deep.equal([3]);

    const last = t.next();
    t.send(answered);
    expect(await last).to.deep.equal({ type: 'end', answer: ANSWER });
    expect(t.w.mode).to.equal('ended');
    expect(await t.next()).to.equal(undefined);
    expect(t.listening()).to.equal(false, 'an ended watch stops listening');
  });

  it('settling delivers the frames still in hand before the answer', async () => {
    const t = start();
    const first = t.next();
    t.send(framesEvent(frames(1, 1, 2)));
    t.send(answered);
    expect(seqs(await first)).to.deep.equal([1, 2]);
    expect(t.w.mode).to.equal('checking');
    t.send(framesEvent(frames(1, 3, 4))); // committed before the answer, heard after it
    expect(seqs(await t.next())).to.deep.equal([3, 4]);
    expect(t.w.mode).to.equal('settling');
    expect(await t.next()).to.deep.equal({ type: 'end', answer: ANSWER });
    expect(t.w.mode).to.equal('ended');
  });

  it('frames of another attempt end it: the followed frames first, then superseded, said once', async () => {
    const t = start();
    const first = t.next();
    t.send(framesEvent([...frames(1, 1, 2), ...frames(2, 3, 3)]));
    expect(seqs(await first)).to.deep.equal([1, 2], 'the frames of the attempt followed, cut where the other begins');
    expect(t.w.mode).to.equal('superseded');
    expect(await t.next()).to.deep.equal({ type: 'superseded' });
    expect(await t.next()).to.equal(undefined);
    expect(t.modes).to.deep.equal(['superseded', 'ended', 'ended']);
  });

  it('a later turn that meets only another attempt\'s frames is superseded with nothing delivered', async () => {
    const t = start();
    const first = t.next();
    t.send(framesEvent(frames(1, 1, 1)));
    expect(seqs(await first)).to.deep.equal([1]);
    const second = t.next();
    t.send(framesEvent(frames(2, 2, 2)));
    expect(await second).to.deep.equal({ type: 'superseded' });
    expect(t.w.mode).to.equal('ended');
  });

  it('quiet for idleMs: an idle tick, then following again', async () => {
    const t = start({ idleMs: 1 });
    expect(await t.next()).to.deep.equal({ type: 'idle' });
    expect(t.w.mode).to.equal('following');
    t.send(framesEvent(frames(1, 1, 1)));
    expect(seqs(await t.next())).to.deep.equal([1]);
  });

  it('the caller leaving ends a waiting watch with nothing more', async () => {
    const t = start();
    const pending = t.next();
    await settle();
    expect(t.w.mode).to.equal('waiting');
    t.left.abort();
    expect(await pending).to.equal(undefined);
    expect(t.w.mode).to.equal('ended');
  });

  it('a request that was not streamed goes from the answer straight to the end', async () => {
    const t = start({ streaming: false });
    const pending = t.next();
    await settle();
    expect(t.w.mode).to.equal('waiting');
    t.send(answered);
    expect(await pending).to.deep.equal({ type: 'end', answer: ANSWER });
    expect(t.modes).to.deep.equal(['ended']);
  });
});
