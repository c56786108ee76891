// Model resolution for the submission path: which rule wins for a model in a namespace, and
// the backend it routes to. Each namespace's rules are compiled once and cached in memory;
// every process drops a namespace's entry when the database says its rules or backends
// changed (triggers NOTIFY `routing` on the bus), and drops everything after a bus
// reconnect, because NOTIFY is not replayed. A process has one cache, kept with its bus: the
// API's acceptance and the executor's batch dispatcher resolve through the same entries.
import type { BaseDeps } from '../deps.ts';
import { compileRules, type Rule } from '../core/routing.ts';
import { loadRouting, type RoutingEntry } from '../db/routing-rules.ts';
import type { BackendForCall } from '../db/backends.ts';
import { logger } from '../log.ts';

export type Resolution = { rule: Rule; backend: BackendForCall } | { declined: Rule } | null;

type Compiled = { match: (model: string) => Rule | undefined; backends: Map<string, BackendForCall> };

type RoutingCache = {
  resolve(namespaceId: string, model: string): Promise<Resolution>;
  close(): void;
};

// Namespaces are many and each entry is small; past this many the oldest entry goes.
const MAX_NAMESPACES = 10_000;

// What a cache needs of a process: the database and the bus its invalidations come on.
type RoutingDeps = Pick<BaseDeps, 'pool' | 'bus'>;

const caches = new WeakMap<BaseDeps['bus'], RoutingCache>();

function compile(entries: RoutingEntry[]): Compiled {
  const backends = new Map<string, BackendForCall>();
  const rules: Rule[] = [];
  for (const e of entries) {
    if (e.rule.action === 'route') {
      // The foreign key makes this impossible; a rule without its backend must not match.
      if (e.backend === null) {
        logger.error('routing rule without its backend; ignored', { rule_id: e.rule.rule_id });
        continue;
      }
      backends.set(e.backend.backend_id, e.backend);
    }
    rules.push(e.rule);
  }
  return { match: compileRules(rules), backends };
}

function createRoutingCache(deps: RoutingDeps): RoutingCache {
  const entries = new Map<string, Promise<Compiled>>();
  const drop = (namespaceId: unknown) => {
    if (typeof namespaceId === 'string') entries.delete(namespaceId);
    else entries.clear();
  };
  const unsubscribe = deps.bus.subscribe('routing', (msg) => drop(msg.namespace_id));
  const unReconnect = deps.bus.onReconnect(() => entries.clear());

  const compiled = (namespaceId: string): Promise<Compiled> => {
    const hit = entries.get(namespaceId);
    if (hit) return hit;
    // Stored before it settles so concurrent misses share one read. An invalidation that
    // arrives meanwhile deletes it, and the next call reads again.
    const loading = loadRouting(deps.pool, namespaceId).then(compile);
    entries.set(namespaceId, loading);
    loading.catch(() => {
      if (entries.get(namespaceId) === loading) entries.delete(namespaceId);
    });
    if (entries.size > MAX_NAMESPACES) entries.delete(entries.keys().next().value!);
    return loading;
  };

  return {
    async resolve(namespaceId, model) {
      const { match, backends } = await compiled(namespaceId);
      const rule = match(model);
      if (rule === undefined) return null;
      if (rule.action === 'decline') return { declined: rule };
      return { rule, backend: backends.get(rule.backend_id!)! };
    },
    close() {
      unsubscribe();
      unReconnect();
      entries.clear();
    },
  };
}

/**
 * The rule that wins for `model` in the namespace and, when it routes, its backend
 * (docs/administration.md "Routing rules": exact beats pattern, longest literal, priority, age).
 * `{ declined }` when the winning rule declines; null when no rule matches. Costs no database
 * round trip while the namespace's entry is cached.
 */
export function resolveModel(deps: RoutingDeps, namespaceId: string, model: string): Promise<Resolution> {
  let cache = caches.get(deps.bus);
  if (!cache) caches.set(deps.bus, (cache = createRoutingCache(deps)));
  return cache.resolve(namespaceId, model);
}

/** Tells this process's cache at once (other processes hear the trigger's NOTIFY). */
export function routingChanged(deps: Pick<BaseDeps, 'bus'>, namespaceId: string): void {
  deps.bus.publishLocal({ k: 'routing', namespace_id: namespaceId });
}

/** Releases the cache's bus subscriptions (at shutdown, once nothing resolves any more). */
export function closeRouting(deps: Pick<BaseDeps, 'bus'>): void {
  caches.get(deps.bus)?.close();
  caches.delete(deps.bus);
}
