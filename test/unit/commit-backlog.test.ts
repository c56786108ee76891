import { expect } from 'chai';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { createCommitBacklog } from '../../src/core/commit-backlog.ts';

/** Whether `p` has settled once every pending callback has run. */
async function isSettled(p: Promise<unknown>): Promise<boolean> {
  let settled = false;
  void p.then(
    () => (settled = true),
    () => (settled = true),
  );
  await nextTurn();
  return settled;
}

describe('commit backlog', () => {
  it('lets the producer read on up to its bound, and past it until half has settled', async () => {
    const backlog = createCommitBacklog<Error>(8, () => {});
    backlog.handed(5);
    backlog.handed(3);
    expect(backlog.full()).to.equal(false, 'at the bound: no pause');
    backlog.handed(2);
    expect(backlog.full()).to.equal(true);
    const drained = backlog.drained();
    backlog.settled(5);
    expect(await isSettled(drained)).to.equal(false, '5 unsettled, half the bound is 4');
    backlog.settled(1);
    expect(await isSettled(drained)).to.equal(true);
    expect(backlog.full()).to.equal(false);
  });

  it('answers only once everything handed over settled', async () => {
    const backlog = createCommitBacklog<Error>(8, () => {});
    expect(await backlog.allSettled()).to.equal(null, 'nothing handed over: at once');
    backlog.handed(2);
    backlog.handed(1);
    const all = backlog.allSettled();
    backlog.settled(2);
    expect(await isSettled(all)).to.equal(false);
    backlog.settled(1);
    expect(await all).to.equal(null);
  });

  it('keeps the first failure, reports it once at once, and still waits for the rest', async () => {
    const reported: Error[] = [];
    const backlog = createCommitBacklog<Error>(8, (failure) => reported.push(failure));
    const first = new Error('first');
    backlog.handed(1);
    backlog.handed(1);
    backlog.handed(1);
    const all = backlog.allSettled();
    backlog.settled(1);
    backlog.settled(1, first);
    expect(reported).to.deep.equal([first], 'reported when it happened');
    expect(await isSettled(all)).to.equal(false, 'one write is still in flight');
    backlog.settled(1, new Error('second'));
    expect(await all).to.equal(first);
    expect(reported).to.deep.equal([first]);
  });
});
