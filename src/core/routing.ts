// Routing-rule matching (docs/administration.md "Routing rules"). A rule's `model` is an exact
// name or a pattern in which `*` stands for any run of characters, including none; every other
// character is literal. Resolution order:
//   1. an exact rule beats any pattern;
//   2. among patterns, the longest literal part (characters that are not `*`) wins;
//   3. then the higher priority;
//   4. then the older rule (created_at, then rule_id).
// Matching is done without regular expressions: no escaping to get wrong, and no
// backtracking blow-up on long model names against many-star patterns.

export type RuleAction = 'route' | 'decline';

export type Rule = {
  rule_id: string;
  model: string;
  backend_id: string | null;
  /** Tried in order after a retryable failure on the backend before. */
  fallback_backend_ids: readonly string[];
  rewrite_model: string | null;
  priority: number;
  action: RuleAction;
  created_at: string | number | Date;
};

export function isPattern(model: string): boolean {
  return model.includes('*');
}

/** Number of characters in a rule's model that are not `*`. */
export function literalLength(model: string): number {
  let n = 0;
  for (const ch of model) if (ch !== '*') n++;
  return n;
}

/** A matcher for one glob pattern. */
export function compilePattern(pattern: string): (model: string) => boolean {
  const segments = pattern.split('*');
  if (segments.length === 1) return (model) => model === pattern;
  const head = segments[0];
  const tail = segments[segments.length - 1];
  const middle = segments.slice(1, -1).filter((s) => s !== '');
  const fixed = head.length + tail.length;
  return (model) => {
    if (model.length < fixed || !model.startsWith(head) || !model.endsWith(tail)) return false;
    // Taking each middle segment at its leftmost place leaves the most room for the rest,
    // so a greedy scan is exact for `*`-only globs.
    let pos = head.length;
    const end = model.length - tail.length;
    for (const seg of middle) {
      const at = model.indexOf(seg, pos);
      if (at < 0 || at + seg.length > end) return false;
      pos = at + seg.length;
    }
    return true;
  };
}

function createdMs(v: Rule['created_at']): number {
  if (typeof v === 'number') return v;
  if (v instanceof Date) return v.getTime();
  return Date.parse(v);
}

// Precedence among rules that all match; negative when `a` wins.
function compareRules(a: Rule, b: Rule): number {
  const exactA = !isPattern(a.model);
  const exactB = !isPattern(b.model);
  if (exactA !== exactB) return exactA ? -1 : 1;
  const lit = literalLength(b.model) - literalLength(a.model);
  if (lit !== 0) return lit;
  if (a.priority !== b.priority) return b.priority - a.priority;
  const ta = createdMs(a.created_at);
  const tb = createdMs(b.created_at);
  if (!Number.isNaN(ta) && !Number.isNaN(tb) && ta !== tb) return ta - tb;
  if (a.rule_id !== b.rule_id) return a.rule_id < b.rule_id ? -1 : 1;
  return 0;
}

/**
 * Builds a matcher over a namespace's rules. The answer is the winning rule, whatever
 * its action: the caller routes or declines. Undefined means no rule matched.
 */
export function compileRules(rules: readonly Rule[]): (model: string) => Rule | undefined {
  const exact = new Map<string, Rule>();
  const patterns: { rule: Rule; matches: (model: string) => boolean }[] = [];
  for (const rule of [...rules].sort(compareRules)) {
    if (isPattern(rule.model)) {
      patterns.push({ rule, matches: compilePattern(rule.model) });
    } else if (!exact.has(rule.model)) {
      exact.set(rule.model, rule);
    }
  }
  return (model) => {
    const hit = exact.get(model);
    if (hit !== undefined) return hit;
    for (const p of patterns) if (p.matches(model)) return p.rule;
    return undefined;
  };
}
