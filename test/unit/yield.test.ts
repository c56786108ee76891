import { expect } from 'chai';
import { setTimeout as sleep } from 'node:timers/promises';
import { createYielder, loopUtilisation, mustYield, type YieldSettings, type Yielder } from '../../src/executor/yield.ts';

const S: YieldSettings = { busyUtilisation: 0.5, arrivalWindowMs: 40, maxWaitMs: 400, sampleMs: 5, tickMs: 5, perTick: 1 };

/** Runs `fn` while submissions keep arriving (one every 5 ms). */
async function whileArriving(y: Yielder, fn: () => Promise<void>): Promise<void> {
  y.arrival();
  const feeding = setInterval(() => y.arrival(), 5);
  try {
    await fn();
  } finally {
    clearInterval(feeding);
  }
}

/** Whether `p` has settled after `ms`. */
async function settledWithin(p: Promise<void>, ms: number): Promise<boolean> {
  let done = false;
  void p.then(() => (done = true));
  await sleep(ms);
  return done;
}

describe('background work yielding to acceptance', () => {
  it('yields only while submissions arrive and the loop is saturated', () => {
    expect(mustYield(S, { utilisation: 0.9, sinceArrivalMs: 10 })).to.equal(true);
    expect(mustYield(S, { utilisation: 0.5, sinceArrivalMs: 0 })).to.equal(true);
    expect(mustYield(S, { utilisation: 0.49, sinceArrivalMs: 0 })).to.equal(false, 'a loop with headroom');
    expect(mustYield(S, { utilisation: 1, sinceArrivalMs: 40 })).to.equal(false, 'nothing arriving: a backlog drains at full speed');
    expect(mustYield(S, { utilisation: 1, sinceArrivalMs: Infinity })).to.equal(false, 'a process that only executes');
  });

  it('starts at once when the process is not accepting', async () => {
    const y = createYielder(S, () => 1);
    expect(await settledWithin(y.wait(new AbortController().signal), 1)).to.equal(true);
  });

  it('holds work while arrivals keep coming to a saturated loop, and lets it go once they stop', async () => {
    const y = createYielder(S, () => 1);
    y.arrival();
    const started = y.wait(new AbortController().signal);
    await whileArriving(y, async () => {
      expect(await settledWithin(started, 150)).to.equal(false);
    });
    expect(await settledWithin(started, 200)).to.equal(true);
  });

  it('lets work go when the loop has headroom again, and keeps the order work arrived in', async () => {
    let load = 1;
    const y = createYielder(S, () => load);
    await whileArriving(y, async () => {
      const order: number[] = [];
      const first = y.wait(new AbortController().signal).then(() => order.push(1));
      const second = y.wait(new AbortController().signal).then(() => order.push(2));
      expect(await settledWithin(first.then(() => undefined), 50)).to.equal(false);
      load = 0.1;
      await Promise.all([first, second]);
      expect(order).to.deep.equal([1, 2]);
    });
  });

  it('while arrivals go on, a loop with headroom lets a few go a tick, not the whole backlog at once', async () => {
    let load = 1;
    const y = createYielder({ ...S, tickMs: 50, perTick: 2 }, () => load);
    await whileArriving(y, async () => {
      let started = 0;
      const all = Array.from({ length: 8 }, () => y.wait(new AbortController().signal).then(() => void started++));
      await sleep(60);
      expect(started).to.equal(0);
      load = 0.1;
      await sleep(110); // two ticks, give or take a late timer
      expect(started).to.be.within(1, 6);
      await Promise.all(all);
    });
  });

  it('never holds work longer than the bound, however long the overload lasts', async () => {
    const y = createYielder(S, () => 1);
    await whileArriving(y, async () => {
      const started = y.wait(new AbortController().signal);
      expect(await settledWithin(started, 100)).to.equal(false);
      expect(await settledWithin(started, S.maxWaitMs + 200)).to.equal(true);
    });
  });

  it('lets work go at once when its attempt is aborted, or the process stops', async () => {
    const y = createYielder(S, () => 1);
    await whileArriving(y, async () => {
      const controller = new AbortController();
      const aborted = y.wait(controller.signal);
      const stopped = y.wait(new AbortController().signal);
      controller.abort(new Error('lease lost'));
      expect(await settledWithin(aborted, 1)).to.equal(true);
      expect(await settledWithin(stopped, 20)).to.equal(false);
      y.releaseAll();
      expect(await settledWithin(stopped, 1)).to.equal(true);
    });
  });

  it('measures the loop: busy while it spins, idle while it sleeps', async () => {
    const sample = loopUtilisation(20);
    await sleep(30);
    const until = performance.now() + 80;
    while (performance.now() < until); // the loop is busy
    expect(sample()).to.be.greaterThan(0.5);
    await sleep(60);
    expect(sample()).to.be.lessThan(0.5);
  });
});
