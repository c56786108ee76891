// `sarsen apply`: what a configuration file asks for against what the tenancy holds, as a list
// of changes. Pure: no database, no files. Namespaces, backends and live API keys are matched by
// name, routing rules by their model pattern (their fallbacks compared in order); a field the
// file leaves out takes its default (the file is the whole state of what it names). With
// `prune`, what the file no longer names is removed (API keys are revoked).
import type { BackendKind, CredentialSource } from '../db/backends.ts';
import type { Grant } from '../db/api-keys.ts';

export type DesiredBackend = {
  name: string;
  kind: BackendKind;
  address: string; // normalised
  credential_source: CredentialSource;
  credential: string | null; // resolved from its env:/file: reference
};
/** `backend` and `fallbacks` (tried in order) are names of the file's backends. */
export type DesiredRule = { model: string; backend: string | null; fallbacks: string[]; rewrite_model: string | null; priority: number; action: 'route' | 'decline' };
/** A key's rate limits as stored: null fields are off. */
export type Limits = { requests_per_minute: number | null; tokens_per_minute: number | null };
export type DesiredKey = { name: string; grants: Grant[]; spend_limit: number | null; limits: Limits };
export type DesiredNamespace = {
  name: string;
  retention_minutes: number | null;
  spend_limit: number | null;
  cache_ttl_minutes: number | null;
  backends: DesiredBackend[];
  routing_rules: DesiredRule[];
  api_keys: DesiredKey[];
};

export type CurrentBackend = { id: string; name: string; kind: BackendKind; address: string; credential_source: CredentialSource; credential: string | null };
export type CurrentRule = { id: string; model: string; backend_id: string | null; fallback_backend_ids: string[]; rewrite_model: string | null; priority: number; action: 'route' | 'decline' };
export type CurrentKey = { id: string; name: string; grants: Grant[]; spend_limit: number | null; limits: Limits };
export type CurrentNamespace = {
  id: string;
  name: string;
  retention_minutes: number | null;
  spend_limit: number | null;
  cache_ttl_minutes: number | null;
  backends: CurrentBackend[];
  routing_rules: CurrentRule[]; // oldest first
  api_keys: CurrentKey[]; // live ones
};

/** A rule's backend: the id of one that exists, or the name of one this plan creates. */
export type BackendRef = { id: string } | { name: string } | null;
type RuleBackends = { backend: BackendRef; fallbacks: NonNullable<BackendRef>[] };

export type Change =
  | { op: 'create'; what: 'namespace'; ns: string; desired: DesiredNamespace }
  | { op: 'update'; what: 'namespace'; ns: string; id: string; desired: DesiredNamespace; fields: string[] }
  | { op: 'delete'; what: 'namespace'; ns: string; id: string }
  | { op: 'create'; what: 'backend'; ns: string; desired: DesiredBackend }
  | { op: 'update'; what: 'backend'; ns: string; id: string; desired: DesiredBackend; fields: string[] }
  | { op: 'delete'; what: 'backend'; ns: string; id: string; name: string }
  | ({ op: 'create'; what: 'rule'; ns: string; desired: DesiredRule } & RuleBackends)
  | ({ op: 'update'; what: 'rule'; ns: string; id: string; desired: DesiredRule; fields: string[] } & RuleBackends)
  | { op: 'delete'; what: 'rule'; ns: string; id: string; model: string }
  | { op: 'create'; what: 'key'; ns: string; desired: DesiredKey }
  | { op: 'update'; what: 'key'; ns: string; id: string; desired: DesiredKey; fields: string[] }
  | { op: 'replace'; what: 'key'; ns: string; id: string; desired: DesiredKey; fields: string[] }
  | { op: 'delete'; what: 'key'; ns: string; id: string; name: string };

export type Plan = { changes: Change[]; unchanged: number };

function differing<K extends string>(want: Record<K, unknown>, have: Record<K, unknown>, fields: K[]): string[] {
  return fields.filter((f) => JSON.stringify(want[f]) !== JSON.stringify(have[f]));
}

/**
 * The changes, in the order they can be made: namespaces created or changed, backends created
 * or changed, rules removed, changed and created, backends removed, keys, namespaces removed.
 */
export function planApply(desired: readonly DesiredNamespace[], current: readonly CurrentNamespace[], prune: boolean): Plan {
  const early: Change[] = [];
  const backends: Change[] = [];
  const rules: Change[] = [];
  const lateBackends: Change[] = [];
  const keys: Change[] = [];
  const late: Change[] = [];
  let unchanged = 0;

  for (const want of desired) {
    const have = current.find((n) => n.name === want.name);
    const ns = want.name;
    if (!have) early.push({ op: 'create', what: 'namespace', ns, desired: want });
    else {
      const fields = differing(want, have, ['retention_minutes', 'spend_limit', 'cache_ttl_minutes']);
      if (fields.length > 0) early.push({ op: 'update', what: 'namespace', ns, id: have.id, desired: want, fields });
      else unchanged++;
    }

    for (const b of want.backends) {
      const cur = have?.backends.find((x) => x.name === b.name);
      if (!cur) backends.push({ op: 'create', what: 'backend', ns, desired: b });
      else {
        const fields = differing(b, cur, ['kind', 'address', 'credential_source', 'credential']);
        if (fields.length > 0) backends.push({ op: 'update', what: 'backend', ns, id: cur.id, desired: b, fields });
        else unchanged++;
      }
    }
    const backendRef = (name: string): NonNullable<BackendRef> => {
      const cur = have?.backends.find((x) => x.name === name);
      return cur ? { id: cur.id } : { name };
    };
    const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

    const matched = new Set<string>();
    for (const r of want.routing_rules) {
      const cur = have?.routing_rules.find((x) => x.model === r.model && !matched.has(x.id));
      const refs: RuleBackends = { backend: r.backend === null ? null : backendRef(r.backend), fallbacks: r.fallbacks.map(backendRef) };
      if (!cur) {
        rules.push({ op: 'create', what: 'rule', ns, desired: r, ...refs });
        continue;
      }
      matched.add(cur.id);
      const fields = differing(r, cur, ['rewrite_model', 'priority', 'action']);
      if (!same(refs.fallbacks, cur.fallback_backend_ids.map((id) => ({ id })))) fields.unshift('fallback_backends');
      if (!same(refs.backend, cur.backend_id === null ? null : { id: cur.backend_id })) fields.unshift('backend');
      if (fields.length > 0) rules.push({ op: 'update', what: 'rule', ns, id: cur.id, desired: r, ...refs, fields });
      else unchanged++;
    }

    for (const k of want.api_keys) {
      const cur = have?.api_keys.find((x) => x.name === k.name);
      if (!cur) keys.push({ op: 'create', what: 'key', ns, desired: k });
      else {
        // A key's grants and spend limit are fixed when it is issued: a change issues a new key
        // (with the file's rate limits). Its rate limits alone change in place.
        const fixed = differing(k, cur, ['grants', 'spend_limit']);
        const limits = differing(k, cur, ['limits']);
        if (fixed.length > 0) keys.push({ op: 'replace', what: 'key', ns, id: cur.id, desired: k, fields: [...fixed, ...limits] });
        else if (limits.length > 0) keys.push({ op: 'update', what: 'key', ns, id: cur.id, desired: k, fields: limits });
        else unchanged++;
      }
    }

    if (prune && have) {
      for (const r of have.routing_rules) if (!matched.has(r.id)) rules.unshift({ op: 'delete', what: 'rule', ns, id: r.id, model: r.model });
      for (const b of have.backends) if (!want.backends.some((x) => x.name === b.name)) lateBackends.push({ op: 'delete', what: 'backend', ns, id: b.id, name: b.name });
      for (const k of have.api_keys) if (!want.api_keys.some((x) => x.name === k.name)) keys.push({ op: 'delete', what: 'key', ns, id: k.id, name: k.name });
    }
  }
  if (prune) {
    for (const have of current) if (!desired.some((n) => n.name === have.name)) late.push({ op: 'delete', what: 'namespace', ns: have.name, id: have.id });
  }
  return { changes: [...early, ...backends, ...rules, ...lateBackends, ...keys, ...late], unchanged };
}

const SIGN = { create: '+', update: '~', replace: '±', delete: '-' } as const;

/** One line per change, for people: `+ backend prod/openai`, `~ routing rule prod/gpt-* (priority)`. */
export function describeChange(c: Change): string {
  const fields = 'fields' in c ? ` (${c.fields.join(', ')})` : '';
  switch (c.what) {
    case 'namespace':
      return `${SIGN[c.op]} namespace ${c.ns}${fields}`;
    case 'backend':
      return `${SIGN[c.op]} backend ${c.ns}/${'desired' in c ? c.desired.name : c.name}${fields}`;
    case 'rule':
      return `${SIGN[c.op]} routing rule ${c.ns}/${'desired' in c ? c.desired.model : c.model}${fields}`;
    case 'key':
      return `${SIGN[c.op]} api key ${c.ns}/${'desired' in c ? c.desired.name : c.name}${fields}${c.op === 'delete' ? ' (revoked)' : ''}${c.op === 'replace' ? ' (revoked, and a new key issued)' : ''}`;
  }
}
