import { expect } from 'chai';
import { compilePattern, compileRules, literalLength } from '../../src/core/routing.ts';
import type { Rule } from '../../src/core/routing.ts';

let seq = 0;
function rule(model: string, extra: Partial<Rule> = {}): Rule {
  seq++;
  return {
    rule_id: `rule_${String(seq).padStart(4, '0')}`,
    model,
    backend_id: `bk_${seq}`,
    fallback_backend_ids: [],
    rewrite_model: null,
    priority: 0,
    action: 'route',
    created_at: `2025-01-01T00:00:${String(seq % 60).padStart(2, '0')}.000Z`,
    ...extra,
  };
}

describe('routing', () => {
  describe('compilePattern', () => {
    const cases: [string, string, boolean][] = [
      ['*', '', true],
      ['*', 'anything at all', true],
      ['gpt-*', 'gpt-4o', true],
      ['gpt-*', 'gpt-', true],
      ['gpt-*', 'gpt', false],
      ['*-mini', 'gpt-4o-mini', true],
      ['*-mini', 'gpt-4o-mini-2024', false],
      ['claude-*-sonnet-*', 'claude-3-5-sonnet-20241022', true],
      ['claude-*-sonnet-*', 'claude-3-5-haiku-20241022', false],
      ['a*b*c', 'abc', true],
      ['a*b*c', 'axxbyyc', true],
      ['a*b*c', 'acb', false],
      ['a**b', 'ab', true],
      ['ab*ba', 'aba', false],
      ['ab*ba', 'abba', true],
      ['*a*a*a*', 'aaa', true],
      ['*a*a*a*', 'aa', false],
      ['exact', 'exact', true],
      ['exact', 'exactly', false],
    ];
    for (const [pattern, model, want] of cases) {
      it(`${JSON.stringify(pattern)} ${want ? 'matches' : 'does not match'} ${JSON.stringify(model)}`, () => {
        expect(compilePattern(pattern)(model)).to.equal(want);
      });
    }

    it('treats regular-expression characters literally', () => {
      expect(compilePattern('gpt-4.1*')('gpt-4.1-mini')).to.equal(true);
      expect(compilePattern('gpt-4.1*')('gpt-401-mini')).to.equal(false);
      expect(compilePattern('a+b*')('a+bc')).to.equal(true);
      expect(compilePattern('a+b*')('aab')).to.equal(false);
      expect(compilePattern('(x|y)*')('(x|y)z')).to.equal(true);
      expect(compilePattern('(x|y)*')('x')).to.equal(false);
      expect(compilePattern('[a-z]?*')('[a-z]?!')).to.equal(true);
      expect(compilePattern('[a-z]?*')('b')).to.equal(false);
      expect(compilePattern('^$\\*')('^$\\ok')).to.equal(true);
      expect(compilePattern('.*')('xyz')).to.equal(false);
      expect(compilePattern('.*')('.xyz')).to.equal(true);
      expect(compilePattern('a*z')('a\nz')).to.equal(true);
    });

    it('answers a long model against many-star patterns without backtracking (a backtracking matcher would not finish)', () => {
      const model = 'a'.repeat(200_000);
      expect(compilePattern('*a*a*a*a*a*a*a*b')(model)).to.equal(false);
      expect(compilePattern('*a*a*a*a*a*a*a*b*')(model)).to.equal(false);
      expect(compilePattern('*a*a*a*a*a*a*a*')(model)).to.equal(true);
    });
  });

  it('counts literal characters', () => {
    expect(literalLength('gpt-*')).to.equal(4);
    expect(literalLength('**')).to.equal(0);
    expect(literalLength('exact')).to.equal(5);
  });

  describe('compileRules', () => {
    it('returns undefined when nothing matches', () => {
      const match = compileRules([rule('gpt-4o'), rule('claude-*')]);
      expect(match('llama-3')).to.equal(undefined);
      expect(match('gpt-4o-mini')).to.equal(undefined);
      expect(compileRules([])('anything')).to.equal(undefined);
    });

    it('prefers an exact rule to any pattern, whatever the priorities', () => {
      const exact = rule('gpt-4o', { priority: -10 });
      const pattern = rule('gpt-4*', { priority: 100 });
      const catchAll = rule('*', { priority: 1000 });
      const match = compileRules([catchAll, pattern, exact]);
      expect(match('gpt-4o')).to.equal(exact);
      expect(match('gpt-4o-mini')).to.equal(pattern);
      expect(match('other')).to.equal(catchAll);
    });

    it('prefers the longest literal part among patterns, whatever the priorities', () => {
      const short = rule('claude-*', { priority: 50 });
      const long = rule('claude-*-sonnet-*', { priority: 1 });
      const suffix = rule('*-20241022', { priority: 99 });
      const match = compileRules([short, long, suffix]);
      expect(match('claude-3-5-sonnet-20241022')).to.equal(long); // 15 literal > 9 > 7
      expect(match('claude-3-5-haiku-20241022')).to.equal(suffix); // 9 > 7
      expect(match('claude-instant')).to.equal(short);
    });

    it('uses priority when literal lengths tie', () => {
      const low = rule('gpt*', { priority: 1 });
      const high = rule('*-4o', { priority: 5 });
      expect(compileRules([low, high])('gpt-4o')).to.equal(high);
      expect(compileRules([high, low])('gpt-4o')).to.equal(high);
    });

    it('uses priority among exact rules for the same model', () => {
      const a = rule('gpt-4o', { priority: 1 });
      const b = rule('gpt-4o', { priority: 2 });
      expect(compileRules([a, b])('gpt-4o')).to.equal(b);
    });

    it('then prefers the older rule by created_at, whatever the input order', () => {
      const older = rule('gpt*', { created_at: '2025-01-01T00:00:00Z', rule_id: 'rule_Z' });
      const newer = rule('*-4o', { created_at: '2025-06-01T00:00:00Z', rule_id: 'rule_A' });
      expect(compileRules([newer, older])('gpt-4o')).to.equal(older);
      expect(compileRules([older, newer])('gpt-4o')).to.equal(older);
    });

    it('compares created_at as a time, accepting numbers, dates and differently written strings', () => {
      const a = rule('x*', { created_at: '2025-01-01T01:00:00+01:00', rule_id: 'rule_B' }); // 00:00Z
      const b = rule('*x', { created_at: '2025-01-01T00:30:00Z', rule_id: 'rule_A' });
      expect(compileRules([b, a])('xx')).to.equal(a);
      const n = rule('x*', { created_at: 2000, rule_id: 'rule_B' });
      const d = rule('*x', { created_at: new Date(1000), rule_id: 'rule_C' });
      expect(compileRules([n, d])('xx')).to.equal(d);
    });

    it('finally breaks ties by rule_id', () => {
      const a = rule('*-4o', { created_at: 1000, rule_id: 'rule_01AAA' });
      const b = rule('gpt*', { created_at: 1000, rule_id: 'rule_01AAB' });
      expect(compileRules([b, a])('gpt-4o')).to.equal(a);
      expect(compileRules([a, b])('gpt-4o')).to.equal(a);
    });

    it('returns decline rules like any other; the caller acts on them', () => {
      const decline = rule('gpt-4-32k', { action: 'decline', backend_id: null });
      const route = rule('gpt-4*');
      const match = compileRules([route, decline]);
      expect(match('gpt-4-32k')?.action).to.equal('decline');
      expect(match('gpt-4o')?.action).to.equal('route');
    });

    it('keeps the rewrite of the winning rule', () => {
      const r = rule('fast', { rewrite_model: 'gpt-4o-mini' });
      expect(compileRules([r])('fast')?.rewrite_model).to.equal('gpt-4o-mini');
    });

    it('does not mutate the input', () => {
      const rules = [rule('b*'), rule('a'), rule('*')];
      const copy = [...rules];
      compileRules(rules);
      expect(rules).to.deep.equal(copy);
    });
  });
});
