import { expect } from 'chai';
import { effectiveRetentionMinutes } from '../../src/core/retention.ts';

const HORIZON = 129_600;

describe('effective retention', () => {
  const cases: [string, number | null, number | null, number][] = [
    ['nothing set: the metadata horizon', null, null, HORIZON],
    ['namespace set: its own value', 60, null, 60],
    ['namespace set beats tenancy', 60, 30, 60],
    ['namespace unset: the tenancy value', null, 30, 30],
    ['namespace 0 keeps everything even where the tenancy sweeps', 0, 30, HORIZON],
    ['tenancy 0 and namespace unset: the metadata horizon', null, 0, HORIZON],
    ['namespace longer than the horizon is clamped', HORIZON * 2, null, HORIZON],
    ['tenancy longer than the horizon is clamped', null, HORIZON + 1, HORIZON],
    ['exactly the horizon', HORIZON, 10, HORIZON],
    ['one minute', 1, null, 1],
  ];
  for (const [name, ns, ten, want] of cases) {
    it(name, () => {
      expect(effectiveRetentionMinutes({ namespaceMinutes: ns, tenancyMinutes: ten, metadataHorizonMinutes: HORIZON })).to.equal(want);
    });
  }

  it('follows a changed metadata horizon', () => {
    expect(effectiveRetentionMinutes({ namespaceMinutes: 500, tenancyMinutes: null, metadataHorizonMinutes: 100 })).to.equal(100);
    expect(effectiveRetentionMinutes({ namespaceMinutes: null, tenancyMinutes: null, metadataHorizonMinutes: 100 })).to.equal(100);
  });
});
