import { expect } from 'chai';
import { setTimeout as sleep } from 'node:timers/promises';
import { createYielder, loopUtilisation, mustYield, type YieldSettings, type Yielder } from '../../src/executor/yield.ts';

// Generous windows, so that what releases work in each test is the cause it names, however
// slowly this machine runs: the arrivals (every 5 ms) never pause for ARRIVAL_WINDOW_MS, and the
// wait bound only plays where a test sets it.
const ARRIVAL_WINDOW_MS = 2000;
const S: YieldSettings = { busyUtilisation: 0.5, arrivalWindowMs: ARRIVAL_WINDOW_MS, maxWaitMs: 600_000, sampleMs: 5, tickMs: 5, perTick: 1 };

/** Runs `fn` while submissions keep arriving (one every 5 ms); answers when the last one arrived. */
async function whileArriving(y: Yielder, fn: () => Promise<void>): Promise<number> {
  let last = performance.now();
  const arrive = () => {
    y.arrival();
    last = performance.now();
  };
  arrive();
  const feeding = setInterval(arrive, 5);
  try {
    await fn();
  } finally {
    clearInterval(feeding);
  }
  return last;
}

/** Whether `p` settles before the event loop turns: at once, with no timer involved. */
async function settledNow(p: Promise<void>): Promise<boolean> {
  let done = false;
  void p.then(() => (done = true));
  for (let i = 0; i < 5; i++) await null;
  return done;
}

/** When `p` settled (performance.now()). */
const settledAt = (p: Promise<void>): Promise<number> => p.then(() => performance.now());

describe('background work yielding to acceptance', () => {
  it('yields only while submissions arrive and the loop is saturated', () => {
    expect(mustYield(S, { utilisation: 0.9, sinceArrivalMs: 10 })).to.equal(true);
    expect(mustYield(S, { utilisation: 0.5, sinceArrivalMs: 0 })).to.equal(true);
    expect(mustYield(S, { utilisation: 0.49, sinceArrivalMs: 0 })).to.equal(false, 'a loop with headroom');
    expect(mustYield(S, { utilisation: 1, sinceArrivalMs: ARRIVAL_WINDOW_MS })).to.equal(false, 'nothing arriving: a backlog drains at full speed');
    expect(mustYield(S, { utilisation: 1, sinceArrivalMs: Infinity })).to.equal(false, 'a process that only executes');
  });

  it('starts at once when the process is not accepting', async () => {
    const y = createYielder(S, () => 1);
    expect(await settledNow(y.wait(new AbortController().signal))).to.equal(true);
  });

  it('holds work while arrivals keep coming to a saturated loop, and lets it go once they stop', async () => {
    const y = createYielder(S, () => 1);
    y.arrival();
    const started = settledAt(y.wait(new AbortController().signal));
    let held = false;
    const lastArrival = await whileArriving(y, async () => {
      await sleep(150);
      held = !(await settledNow(started.then(() => undefined)));
    });
    expect(held, 'held while arrivals came').to.equal(true);
    // Let go by the arrivals stopping: not before the window after the last one closed.
    expect((await started) - lastArrival).to.be.at.least(ARRIVAL_WINDOW_MS - 1);
  });

  it('lets work go when the loop has headroom again, and keeps the order work arrived in', async () => {
    let load = 1;
    const y = createYielder(S, () => load);
    await whileArriving(y, async () => {
      const order: number[] = [];
      const first = y.wait(new AbortController().signal).then(() => order.push(1));
      const second = y.wait(new AbortController().signal).then(() => order.push(2));
      await sleep(50);
      expect(order, 'held while the loop is saturated').to.deep.equal([]);
      load = 0.1;
      await Promise.all([first, second]);
      expect(order).to.deep.equal([1, 2]);
    });
  });

  it('while arrivals go on, a loop with headroom lets a few go a tick, not the whole backlog at once', async () => {
    let load = 1;
    const y = createYielder({ ...S, tickMs: 50, perTick: 2 }, () => load);
    await whileArriving(y, async () => {
      // Starts let go by one tick resolve together, before the next macrotask: one batch.
      const batches: number[] = [];
      let open = false;
      const started = () => {
        if (!open) {
          open = true;
          batches.push(0);
          setImmediate(() => (open = false));
        }
        batches[batches.length - 1]!++;
      };
      const all = Array.from({ length: 8 }, () => y.wait(new AbortController().signal).then(started));
      await sleep(60);
      expect(batches, 'held while the loop is saturated').to.deep.equal([]);
      load = 0.1;
      await Promise.all(all);
      expect(batches).to.deep.equal([2, 2, 2, 2]);
    });
  });

  it('never holds work longer than the bound, however long the overload lasts', async () => {
    const maxWaitMs = 400;
    const y = createYielder({ ...S, maxWaitMs }, () => 1);
    await whileArriving(y, async () => {
      const ready = performance.now();
      // The overload does not end before this resolves: only the bound lets it go.
      const started = await settledAt(y.wait(new AbortController().signal));
      expect(started - ready).to.be.at.least(maxWaitMs - 1);
    });
  });

  it('lets work go at once when its attempt is aborted, or the process stops', async () => {
    const y = createYielder(S, () => 1);
    await whileArriving(y, async () => {
      const controller = new AbortController();
      const aborted = y.wait(controller.signal);
      const stopped = y.wait(new AbortController().signal);
      controller.abort(new Error('lease lost'));
      expect(await settledNow(aborted)).to.equal(true);
      expect(await settledNow(stopped)).to.equal(false);
      y.releaseAll();
      expect(await settledNow(stopped)).to.equal(true);
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
