import { expect } from 'chai';
import { planApply, describeChange, type CurrentNamespace, type DesiredNamespace } from '../../src/control/apply-plan.ts';

const NO_LIMITS = { requests_per_minute: null, tokens_per_minute: null };

const desired = (over: Partial<DesiredNamespace> = {}): DesiredNamespace => ({
  name: 'prod',
  retention_minutes: null,
  spend_limit: null,
  cache_ttl_minutes: null,
  backends: [{ name: 'chat', kind: 'chat_compat', address: 'https://a.example', credential_source: 'stored', credential: 'sk-1' }],
  routing_rules: [{ model: 'gpt-*', backend: 'chat', fallbacks: [], rewrite_model: null, priority: 0, action: 'route' }],
  api_keys: [{ name: 'ci', grants: ['use'], spend_limit: null, limits: NO_LIMITS }],
  ...over,
});

const current = (over: Partial<CurrentNamespace> = {}): CurrentNamespace => ({
  id: 'ns_1',
  name: 'prod',
  retention_minutes: null,
  spend_limit: null,
  cache_ttl_minutes: null,
  backends: [{ id: 'bk_1', name: 'chat', kind: 'chat_compat', address: 'https://a.example', credential_source: 'stored', credential: 'sk-1' }],
  routing_rules: [{ id: 'rule_1', model: 'gpt-*', backend_id: 'bk_1', fallback_backend_ids: [], rewrite_model: null, priority: 0, action: 'route' }],
  api_keys: [{ id: 'key_1', name: 'ci', grants: ['use'], spend_limit: null, limits: NO_LIMITS }],
  ...over,
});

describe('apply plan', () => {
  it('nothing to do when the state is what the file says', () => {
    expect(planApply([desired()], [current()], true)).to.deep.equal({ changes: [], unchanged: 4 });
  });

  it('a rule pointing at a backend the plan creates names it, to be resolved when it exists', () => {
    const want = desired({
      backends: [...desired().backends, { name: 'new', kind: 'messages', address: 'https://b.example', credential_source: 'stored', credential: null }],
      routing_rules: [{ model: 'gpt-*', backend: 'new', fallbacks: [], rewrite_model: null, priority: 0, action: 'route' }],
    });
    const { changes } = planApply([want], [current()], false);
    expect(changes.map(describeChange)).to.deep.equal(['+ backend prod/new', '~ routing rule prod/gpt-* (backend)']);
    expect(changes[1]).to.include({ op: 'update' }).and.have.deep.property('backend', { name: 'new' });
  });

  it('fallback backends are compared in order, by name; a new one is named until it exists, and --prune removes a dropped backend after the rule lets go of it', () => {
    const backup = (name: string, id: string) => ({
      want: { name, kind: 'chat_compat' as const, address: `https://${name}.example`, credential_source: 'stored' as const, credential: null },
      have: { id, name, kind: 'chat_compat' as const, address: `https://${name}.example`, credential_source: 'stored' as const, credential: null },
    });
    const [b2, b3] = [backup('b2', 'bk_2'), backup('b3', 'bk_3')];
    const rule = (fallbacks: string[]) => [{ ...desired().routing_rules[0]!, fallbacks }];
    const have = current({ backends: [...current().backends, b2.have, b3.have], routing_rules: [{ ...current().routing_rules[0]!, fallback_backend_ids: ['bk_2', 'bk_3'] }] });
    const both = [...desired().backends, b2.want, b3.want];
    expect(planApply([desired({ backends: both, routing_rules: rule(['b2', 'b3']) })], [have], true)).to.deep.equal({ changes: [], unchanged: 6 });

    const reordered = planApply([desired({ backends: both, routing_rules: rule(['b3', 'b2']) })], [have], true).changes;
    expect(reordered.map(describeChange)).to.deep.equal(['~ routing rule prod/gpt-* (fallback_backends)']);
    expect(reordered[0]).to.have.deep.property('fallbacks', [{ id: 'bk_3' }, { id: 'bk_2' }]);

    const fresh = { ...b3.want, name: 'b4' };
    const added = planApply([desired({ backends: [...both, fresh], routing_rules: rule(['b2', 'b3', 'b4']) })], [have], false).changes;
    expect(added.map(describeChange)).to.deep.equal(['+ backend prod/b4', '~ routing rule prod/gpt-* (fallback_backends)']);
    expect(added[1]).to.have.deep.property('fallbacks', [{ id: 'bk_2' }, { id: 'bk_3' }, { name: 'b4' }]);

    const dropped = planApply([desired({ backends: [...desired().backends, b2.want], routing_rules: rule(['b2']) })], [have], true).changes;
    expect(dropped.map(describeChange)).to.deep.equal(['~ routing rule prod/gpt-* (fallback_backends)', '- backend prod/b3']);
    // Without prune the backend stays; the rule still lets go of it.
    expect(planApply([desired({ backends: [...desired().backends, b2.want], routing_rules: rule(['b2']) })], [have], false).changes.map(describeChange))
      .to.deep.equal(['~ routing rule prod/gpt-* (fallback_backends)']);
    // A new rule carries its fallbacks.
    const created = planApply([desired({ backends: both, routing_rules: [...rule(['b2', 'b3']), { ...rule(['b3'])[0]!, model: 'o-*' }] })], [have], false).changes;
    expect(created).to.have.length(1);
    expect(created[0]).to.include({ op: 'create' }).and.have.deep.property('fallbacks', [{ id: 'bk_3' }]);
  });

  it('a second rule with the same model is removed only by prune, before the backends it may use', () => {
    const have = current({ routing_rules: [...current().routing_rules, { id: 'rule_2', model: 'gpt-*', backend_id: 'bk_1', fallback_backend_ids: [], rewrite_model: null, priority: 9, action: 'route' }] });
    expect(planApply([desired()], [have], false).changes).to.deep.equal([]);
    const pruned = planApply([desired({ backends: [], routing_rules: [] })], [have], true).changes;
    expect(pruned.map(describeChange)).to.deep.equal(['- routing rule prod/gpt-*', '- routing rule prod/gpt-*', '- backend prod/chat']);
  });

  it('orders changes so each can be made: namespaces, backends, rules, removed backends, keys, removed namespaces', () => {
    const { changes } = planApply(
      [desired({ name: 'new' })],
      [current({ name: 'old' })],
      true,
    );
    expect(changes.map(describeChange)).to.deep.equal([
      '+ namespace new',
      '+ backend new/chat',
      '+ routing rule new/gpt-*',
      '+ api key new/ci',
      '- namespace old',
    ]);
  });

  it('a key whose grants changed is re-issued; a removed one is revoked', () => {
    const { changes } = planApply([desired({ api_keys: [{ name: 'ci', grants: ['use', 'manage'], spend_limit: null, limits: NO_LIMITS }] })], [current({ api_keys: [...current().api_keys, { id: 'key_2', name: 'old', grants: ['use'], spend_limit: null, limits: NO_LIMITS }] })], true);
    expect(changes.map(describeChange)).to.deep.equal(['± api key prod/ci (grants) (revoked, and a new key issued)', '- api key prod/old (revoked)']);
  });

  it('a key whose rate limits alone changed keeps its secret: they change in place; with its grants, it is re-issued with them', () => {
    const limits = { requests_per_minute: 60, tokens_per_minute: null };
    const inPlace = planApply([desired({ api_keys: [{ name: 'ci', grants: ['use'], spend_limit: null, limits }] })], [current()], false);
    expect(inPlace.changes.map(describeChange)).to.deep.equal(['~ api key prod/ci (limits)']);
    expect(inPlace.changes[0]).to.include({ op: 'update', id: 'key_1' }).and.have.nested.property('desired.limits').that.deep.equals(limits);
    const reissued = planApply([desired({ api_keys: [{ name: 'ci', grants: ['use', 'manage'], spend_limit: null, limits }] })], [current()], false);
    expect(reissued.changes.map(describeChange)).to.deep.equal(['± api key prod/ci (grants, limits) (revoked, and a new key issued)']);
  });

  it('the namespace\'s response cache life is a field of the namespace', () => {
    const { changes } = planApply([desired({ cache_ttl_minutes: 30 })], [current()], false);
    expect(changes.map(describeChange)).to.deep.equal(['~ namespace prod (cache_ttl_minutes)']);
  });
});
