import { expect } from 'chai';
import { createWakeTimer, type Clock } from '../../src/core/wake-timer.ts';

/** A clock whose time moves only when the test says so; `armed` counts timers ever set. */
function fakeClock() {
  let now = 1_000_000;
  let nextId = 0;
  const pending = new Map<number, { at: number; fire: () => void }>();
  let armed = 0;
  const clock: Clock = {
    now: () => now,
    setTimeout(fire, ms) {
      armed++;
      const id = ++nextId;
      pending.set(id, { at: now + ms, fire });
      return id;
    },
    clearTimeout(timer) {
      pending.delete(timer as number);
    },
  };
  return {
    clock,
    armed: () => armed,
    pending: () => [...pending.values()].map((t) => t.at - now),
    /** Moves time on by `ms`, firing every timer that falls due, in order. */
    advance(ms: number) {
      const until = now + ms;
      for (;;) {
        const due = [...pending.entries()].filter(([, t]) => t.at <= until).sort((a, b) => a[1].at - b[1].at)[0];
        if (!due) break;
        pending.delete(due[0]);
        now = due[1].at;
        due[1].fire();
      }
      now = until;
    },
  };
}

const BACKSTOP = 2_000;

describe('wake timer', () => {
  it('arms one timer for the earliest wake-up and does not re-arm it for a later one', () => {
    const time = fakeClock();
    const wakes: boolean[] = [];
    const timer = createWakeTimer(BACKSTOP, (due) => wakes.push(due), time.clock);
    timer.wakeWithin(500);
    timer.wakeWithin(800);
    timer.wakeWithin(500);
    expect(time.armed()).to.equal(1);
    expect(time.pending()).to.deep.equal([500]);
    time.advance(499);
    expect(wakes).to.deep.equal([]);
    time.advance(1);
    expect(wakes).to.have.length(1);
    expect(time.pending()).to.deep.equal([]);
  });

  it('re-arms for an earlier wake-up, leaving no other timer behind', () => {
    const time = fakeClock();
    const wakes: number[] = [];
    const timer = createWakeTimer(BACKSTOP, () => wakes.push(1), time.clock);
    timer.wakeWithin(800);
    timer.wakeWithin(300);
    expect(time.pending()).to.deep.equal([300]);
    time.advance(BACKSTOP);
    expect(wakes).to.have.length(1, 'the cleared timer never fires');
  });

  it('arms afresh once it fired', () => {
    const time = fakeClock();
    const wakes: number[] = [];
    const timer = createWakeTimer(BACKSTOP, () => wakes.push(1), time.clock);
    timer.wakeWithin(100);
    time.advance(100);
    timer.wakeWithin(100);
    expect(time.pending()).to.deep.equal([100]);
    time.advance(100);
    expect(wakes).to.have.length(2);
  });

  it('wakes within the backstop interval at the latest, and at once for a wake-up already due', () => {
    const time = fakeClock();
    const timer = createWakeTimer(BACKSTOP, () => {}, time.clock);
    timer.wakeWithin(60_000);
    expect(time.pending()).to.deep.equal([BACKSTOP]);
    timer.wakeWithin(-5);
    expect(time.pending()).to.deep.equal([0]);
  });

  it('says the backstop is due only when nothing was heard for the whole interval', () => {
    const time = fakeClock();
    const wakes: boolean[] = [];
    const timer = createWakeTimer(BACKSTOP, (due) => wakes.push(due), time.clock);
    timer.wakeWithin(BACKSTOP);
    time.advance(BACKSTOP);
    expect(wakes).to.deep.equal([true], 'quiet since it was created');

    time.advance(1_000);
    timer.heard();
    timer.wakeWithin(BACKSTOP);
    time.advance(BACKSTOP);
    expect(wakes).to.deep.equal([true, true], 'heard a full interval ago');

    timer.heard();
    time.advance(500);
    timer.wakeWithin(1_000);
    time.advance(1_000);
    expect(wakes).to.deep.equal([true, true, false], 'heard 1.5 s ago: an idle tick, no backstop');
  });

  it('never fires once stopped', () => {
    const time = fakeClock();
    const wakes: number[] = [];
    const timer = createWakeTimer(BACKSTOP, () => wakes.push(1), time.clock);
    timer.wakeWithin(100);
    timer.stop();
    expect(time.pending()).to.deep.equal([]);
    time.advance(BACKSTOP * 2);
    expect(wakes).to.deep.equal([]);
  });
});
