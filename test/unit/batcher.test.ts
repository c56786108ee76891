import { expect } from 'chai';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { createBatcher, SPARE_LANE_AT } from '../../src/core/batcher.ts';

/** A flush whose batches stay in flight until released, recording what each lane was given. */
function heldFlush() {
  const inFlight = new Map<number, { items: number[]; release: () => void; fail: (err: Error) => void }>();
  const batches: { lane: number; items: number[] }[] = [];
  let most = 0;
  const flush = (items: number[], lane: number): Promise<number[]> =>
    new Promise((resolve, reject) => {
      expect(inFlight.has(lane), `lane ${lane} flushed twice at once`).to.equal(false);
      batches.push({ lane, items });
      inFlight.set(lane, {
        items,
        release: () => {
          inFlight.delete(lane);
          resolve(items.map((n) => n * 10));
        },
        fail: (err) => {
          inFlight.delete(lane);
          reject(err);
        },
      });
      most = Math.max(most, inFlight.size);
    });
  return { flush, inFlight, batches, most: () => most };
}

describe('group commit batcher', () => {
  it('with one lane, takes everything that arrived while a flush was in flight into the next one', async () => {
    const f = heldFlush();
    const b = createBatcher(f.flush, { maxBatch: 100 });
    const first = b.add(1);
    await nextTurn();
    const rest = [2, 3, 4].map((n) => b.add(n));
    await nextTurn();
    expect(f.batches).to.deep.equal([{ lane: 0, items: [1] }]);
    expect(b.size()).to.equal(4);
    f.inFlight.get(0)!.release();
    expect(await first).to.equal(10);
    await nextTurn();
    expect(f.batches[1]).to.deep.equal({ lane: 0, items: [2, 3, 4] });
    f.inFlight.get(0)!.release();
    expect(await Promise.all(rest)).to.deep.equal([20, 30, 40]);
    expect(f.most()).to.equal(1);
    expect(b.size()).to.equal(0);
  });

  it('with two lanes, starts a second flush while the first is in flight, and never a third', async () => {
    const f = heldFlush();
    const b = createBatcher(f.flush, { maxBatch: 100, lanes: 2 });
    const a = [b.add(1), b.add(2)];
    await nextTurn();
    const c = [b.add(3)];
    await nextTurn();
    expect(f.batches).to.deep.equal([
      { lane: 0, items: [1, 2] },
      { lane: 1, items: [3] },
    ]);
    const d = [b.add(4), b.add(5)];
    await nextTurn();
    expect(f.batches).to.have.length(2, 'both lanes busy: the rest waits');
    expect(b.size()).to.equal(5);

    // The lane that finishes first takes what waited.
    f.inFlight.get(1)!.release();
    expect(await Promise.all(c)).to.deep.equal([30]);
    await nextTurn();
    expect(f.batches[2]).to.deep.equal({ lane: 1, items: [4, 5] });
    f.inFlight.get(0)!.release();
    f.inFlight.get(1)!.release();
    expect(await Promise.all([...a, ...d])).to.deep.equal([10, 20, 40, 50]);
    expect(f.most()).to.equal(2);

    // Both lanes idle again: the next item flushes at once.
    const e = b.add(6);
    await nextTurn();
    expect(f.batches[3]!.items).to.deep.equal([6]);
    f.inFlight.get(f.batches[3]!.lane)!.release();
    expect(await e).to.equal(60);
  });

  it('opens a spare lane beside one in flight only once spareAt items wait, and leaves fewer to the lane in flight', async () => {
    const f = heldFlush();
    const b = createBatcher(f.flush, { maxBatch: 100, lanes: 2, spareAt: 3 });
    const first = b.add(1);
    await nextTurn();
    const some = [b.add(2), b.add(3)];
    await nextTurn();
    expect(f.batches).to.have.length(1, 'two waiting: too few for a spare');
    some.push(b.add(4));
    await nextTurn();
    expect(f.batches[1]).to.deep.equal({ lane: 1, items: [2, 3, 4] });

    const last = b.add(5);
    await nextTurn();
    f.inFlight.get(1)!.release();
    expect(await Promise.all(some)).to.deep.equal([20, 30, 40]);
    await nextTurn();
    expect(f.batches).to.have.length(2, 'the spare goes idle: one item waits for the lane in flight');
    f.inFlight.get(0)!.release();
    expect(await first).to.equal(10);
    await nextTurn();
    expect(f.batches[2]).to.deep.equal({ lane: 0, items: [5] });
    f.inFlight.get(0)!.release();
    expect(await last).to.equal(50);
    expect(b.size()).to.equal(0);
  });

  it('fails only the batch whose flush failed', async () => {
    const f = heldFlush();
    const b = createBatcher(f.flush, { maxBatch: 100, lanes: 2 });
    const first = b.add(1);
    await nextTurn();
    const second = b.add(2);
    await nextTurn();
    f.inFlight.get(0)!.fail(new Error('lost'));
    f.inFlight.get(1)!.release();
    const [one, two] = await Promise.allSettled([first, second]);
    expect(one).to.deep.include({ status: 'rejected' });
    expect(two).to.deep.equal({ status: 'fulfilled', value: 20 });
  });

  it('splits what waited at maxBatch', async () => {
    const f = heldFlush();
    const b = createBatcher(f.flush, { maxBatch: 2 });
    const all = [1, 2, 3, 4, 5].map((n) => b.add(n));
    for (let i = 0; i < 3; i++) {
      await nextTurn();
      f.inFlight.get(0)!.release();
    }
    expect(await Promise.all(all)).to.deep.equal([10, 20, 30, 40, 50]);
    expect(f.batches.map((x) => x.items)).to.deep.equal([[1, 2], [3, 4], [5]]);
  });
  it('lingering, waits while each turn of the event loop adds to a short batch, and flushes at the first turn that adds none', async () => {
    const f = heldFlush();
    const b = createBatcher(f.flush, { maxBatch: 100, linger: 10 });
    const all = [b.add(1)];
    for (const n of [2, 3, 4]) {
      await nextTurn();
      all.push(b.add(n));
    }
    expect(f.batches).to.deep.equal([], 'every turn added an item: still lingering');
    await nextTurn();
    await nextTurn();
    expect(f.batches).to.deep.equal([{ lane: 0, items: [1, 2, 3, 4] }]);
    f.inFlight.get(0)!.release();
    expect(await Promise.all(all)).to.deep.equal([10, 20, 30, 40]);
  });

  it('lingering, an item alone costs one empty turn', async () => {
    const f = heldFlush();
    const b = createBatcher(f.flush, { maxBatch: 100, linger: 10 });
    const one = b.add(1);
    await nextTurn();
    expect(f.batches).to.deep.equal([]);
    await nextTurn();
    expect(f.batches).to.deep.equal([{ lane: 0, items: [1] }]);
    f.inFlight.get(0)!.release();
    expect(await one).to.equal(10);
  });

  it('lingers no more than its turns, and not at all once SPARE_LANE_AT items wait', async () => {
    const f = heldFlush();
    const b = createBatcher(f.flush, { maxBatch: 100, linger: 3 });
    const all: Promise<number>[] = [];
    for (let n = 1; n <= 8; n++) {
      all.push(b.add(n));
      await nextTurn();
    }
    expect(f.batches).to.have.length(1);
    expect(f.batches[0]!.items).to.deep.equal([1, 2, 3, 4], 'the first item, then one a turn for three turns');
    f.inFlight.get(0)!.release();
    await nextTurn();

    for (let i = 0; i < 20; i++) {
      if (f.inFlight.has(0)) f.inFlight.get(0)!.release();
      await nextTurn();
    }
    expect(await Promise.all(all)).to.deep.equal([10, 20, 30, 40, 50, 60, 70, 80]);

    const many = Array.from({ length: SPARE_LANE_AT }, (_, i) => b.add(i));
    await nextTurn();
    expect(f.batches.at(-1)!.items).to.have.length(SPARE_LANE_AT, 'a full batch flushes on the first turn');
    f.inFlight.get(0)!.release();
    await Promise.all(many);
  });
});
