import { expect } from 'chai';
import { isNamespaceName, isSlug, isTenancyName } from '../../src/core/slugs.ts';

describe('slugs', () => {
  it('accepts lowercase slugs up to 63 characters', () => {
    for (const s of ['a', '0', 'default', 'team-a', 'a-', '9lives', 'a--b', 'a'.repeat(63), `x${'-'.repeat(62)}`]) {
      expect(isSlug(s), s).to.equal(true);
    }
  });

  it('refuses everything else', () => {
    for (const s of ['', '-a', 'A', 'Team', 'a_b', 'a.b', 'a b', 'a/b', 'é', 'a'.repeat(64), 'abc\n', ' abc']) {
      expect(isSlug(s), JSON.stringify(s)).to.equal(false);
    }
    expect(isSlug(undefined)).to.equal(false);
    expect(isSlug(12)).to.equal(false);
  });

  it('reserves v1 as a namespace name', () => {
    expect(isNamespaceName('v1')).to.equal(false);
    expect(isNamespaceName('v2')).to.equal(true);
    expect(isNamespaceName('v1-prod')).to.equal(true);
    expect(isNamespaceName('default')).to.equal(true);
    expect(isNamespaceName('V1')).to.equal(false);
    expect(isNamespaceName('-x')).to.equal(false);
  });

  it('reserves root-level route names as tenancy names', () => {
    for (const s of ['v1', 'healthz', 'readyz']) expect(isTenancyName(s), s).to.equal(false);
    expect(isTenancyName('default')).to.equal(true);
    expect(isTenancyName('acme')).to.equal(true);
  });
});
