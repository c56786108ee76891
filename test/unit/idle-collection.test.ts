import { expect } from 'chai';
import { createIdleCollection } from '../../src/core/idle-collection.ts';

const MB = 1024 * 1024;
const OPTIONS = { growthBytes: 16 * MB, idleUtilization: 0.05, busyUtilization: 0.25, firstDelayMs: 10_000, maxDelayMs: 40_000 };

type Sample = readonly [rssMb: number, utilization: number, connections?: number];

/** Feeds one sample a second; answers the seconds at which it collected. */
function run(samples: readonly Sample[]): number[] {
  const c = createIdleCollection(OPTIONS);
  const collected: number[] = [];
  samples.forEach(([rss, utilization, connections = 0], second) => {
    if (c.sample(second * 1000, rss * MB, utilization, connections)) collected.push(second);
  });
  return collected;
}

const repeat = (n: number, sample: Sample): Sample[] => Array.from({ length: n }, () => sample);

describe('idle collection', () => {
  it('does not collect for growth under the threshold', () => {
    expect(run([[100, 0], [115, 0], [115.9, 0], ...repeat(60, [110, 0])])).to.deep.equal([]);
  });

  it('waits while the process works, and collects in its first idle second', () => {
    expect(run([[100, 0], [150, 0.9], [170, 0.5], [170, 0.2], [170, 0.01], [170, 0]])).to.deep.equal([4]);
  });

  it('collects once for a burst whose memory comes back', () => {
    expect(run([[100, 0], [170, 0], ...repeat(8, [170, 0]), ...repeat(60, [105, 0])])).to.deep.equal([1]);
  });

  it('while the memory stays, collects again after delays that double up to the longest', () => {
    expect(run([[100, 0], ...repeat(140, [170, 0])])).to.deep.equal([1, 11, 31, 71, 111]);
  });

  it('starts the delays over when callers connected at its last collection leave, however quietly', () => {
    // Fifty readers that never read sit there through three collections, then leave: what they
    // held is garbage now, collected 10 s after the last collection instead of 40.
    const readers = [[100, 0], ...repeat(40, [170, 0.01, 50]), ...repeat(30, [186, 0.01, 0])] as Sample[];
    expect(run(readers)).to.deep.equal([1, 11, 31, 41, 51]);
    // Some leave, then the rest: each departure counts from the fewest connected since.
    const twice = [[100, 0], ...repeat(40, [170, 0, 50]), ...repeat(12, [170, 0, 20]), ...repeat(20, [170, 0, 0])] as Sample[];
    expect(run(twice)).to.deep.equal([1, 11, 31, 41, 51, 61, 71]);
    // Callers arriving after a collection change nothing.
    const arriving = [[100, 0], ...repeat(40, [170, 0, 0]), ...repeat(20, [170, 0, 50])] as Sample[];
    expect(run(arriving)).to.deep.equal([1, 11, 31]);
  });

  it('starts the delays over after work, or after a return to rest', () => {
    const worked = [[100, 0], ...repeat(40, [170, 0]), [170, 0.9], ...repeat(15, [170, 0])] as Sample[];
    expect(run(worked)).to.deep.equal([1, 11, 31, 42, 52]);
    const rested = [[100, 0], ...repeat(40, [170, 0]), [110, 0], ...repeat(15, [170, 0])] as Sample[];
    expect(run(rested)).to.deep.equal([1, 11, 31, 42, 52]);
  });

  it('starts the delays over when the process grew again since its last collection, busy or not', () => {
    // Slow readers keep it lightly loaded (never busy), and take it from 150 to 200 MB.
    const grown = [[100, 0], ...repeat(40, [150, 0]), ...repeat(10, [170, 0.1]), ...repeat(10, [200, 0.1]), ...repeat(5, [200, 0])] as Sample[];
    expect(run(grown)).to.deep.equal([1, 11, 31, 61]);
  });

  it('collects at most once per first delay however often work and idleness alternate', () => {
    const alternating = [[100, 0], ...Array.from({ length: 30 }, (_, i): Sample => [170, i % 2 ? 0 : 0.9])] as Sample[];
    expect(run(alternating)).to.deep.equal([2, 12, 22]);
  });
});
