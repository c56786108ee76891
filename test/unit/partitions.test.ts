import { expect } from 'chai';
import { floorTo, nextBoundary, partitionName, rangesToCreate, rowSweep, DROP_MIN_HORIZON_MINUTES, DROP_OVERDUE_MS } from '../../src/core/partitions.ts';

const at = (iso: string) => Date.parse(iso);
const DAY = 86_400_000;

describe('partition ranges', () => {
  it('floors to the UTC day and month, and steps to the next', () => {
    expect(floorTo(at('2026-03-15T23:59:59.999Z'), 'day')).to.equal(at('2026-03-15T00:00:00Z'));
    expect(floorTo(at('2026-03-15T10:00:00Z'), 'month')).to.equal(at('2026-03-01T00:00:00Z'));
    expect(nextBoundary(at('2026-12-31T10:00:00Z'), 'day')).to.equal(at('2027-01-01T00:00:00Z'));
    expect(nextBoundary(at('2026-12-31T10:00:00Z'), 'month')).to.equal(at('2027-01-01T00:00:00Z'));
    expect(nextBoundary(at('2028-02-01T00:00:00Z'), 'month')).to.equal(at('2028-03-01T00:00:00Z'));
  });

  it('names a partition by its table and the day or month it starts in', () => {
    expect(partitionName('chunks', at('2026-03-05T00:00:00Z'), 'day')).to.equal('chunks_p20260305');
    expect(partitionName('requests', at('2026-03-05T00:00:00Z'), 'month')).to.equal('requests_p202603');
  });

  it('creates from where the newest ends up to the reach ahead, a day or month each', () => {
    const now = at('2026-03-15T10:00:00Z');
    expect(rangesToCreate(at('2026-03-16T00:00:00Z'), now, 'day', 3 * DAY)).to.deep.equal([
      { lo: at('2026-03-16T00:00:00Z'), hi: at('2026-03-17T00:00:00Z') },
      { lo: at('2026-03-17T00:00:00Z'), hi: at('2026-03-18T00:00:00Z') },
      { lo: at('2026-03-18T00:00:00Z'), hi: at('2026-03-19T00:00:00Z') },
    ]);
    expect(rangesToCreate(at('2026-03-19T00:00:00Z'), now, 'day', 3 * DAY)).to.deep.equal([]);
    // A first partition ending mid-month (the migration's) is followed by the rest of that month.
    expect(rangesToCreate(at('2026-03-16T00:00:00Z'), now, 'month', 31 * DAY)).to.deep.equal([
      { lo: at('2026-03-16T00:00:00Z'), hi: at('2026-04-01T00:00:00Z') },
      { lo: at('2026-04-01T00:00:00Z'), hi: at('2026-05-01T00:00:00Z') },
    ]);
  });

  it('covers a gap left by a long pause with one partition, then goes on by day', () => {
    const now = at('2026-03-15T10:00:00Z');
    const ranges = rangesToCreate(at('2026-02-01T00:00:00Z'), now, 'day', DAY);
    expect(ranges[0]).to.deep.equal({ lo: at('2026-02-01T00:00:00Z'), hi: at('2026-03-15T00:00:00Z') });
    expect(ranges.slice(1).map((r) => r.hi - r.lo)).to.deep.equal([DAY, DAY]);
  });
});

describe('what the row sweep leaves to the drop', () => {
  const now = at('2026-06-01T00:00:00Z');
  const H = 90 * 24 * 60;

  it('sweeps everything past a horizon shorter than the longest, or when the longest is short', () => {
    expect(rowSweep(30 * 24 * 60, H, now, null)).to.deep.equal({ everything: true });
    expect(rowSweep(600, 600, now, null)).to.deep.equal({ everything: true });
    expect(rowSweep(DROP_MIN_HORIZON_MINUTES - 1, DROP_MIN_HORIZON_MINUTES - 1, now, null)).to.deep.equal({ everything: true });
  });

  it('at the longest horizon, sweeps only records the drop would reach late: overdue, or in the migration\'s partition', () => {
    expect(rowSweep(H, H, now, null)).to.deep.equal({ everything: false, belowMs: now - H * 60_000 - DROP_OVERDUE_MS });
    const legacy = now - 10 * DAY;
    expect(rowSweep(H, H, now, legacy)).to.deep.equal({ everything: false, belowMs: legacy });
  });
});
