// A routing rule's chain (its backend, then its fallbacks) must speak one dialect and take
// credentials from one source: a caller-credential request carries no backend credential, and
// a backend's own credential must not go where the caller's was meant to. Checked where a rule
// is written, where a backend it uses is edited, and by `sarsen apply`.
import type { Db } from '../db/tenancies.ts';
import type { CredentialSource, Dialect } from '../db/backends.ts';
import { listBackends } from '../db/backends.ts';
import { rulesUsingBackend } from '../db/routing-rules.ts';

export type ChainMember = { dialect: Dialect; credential_source: CredentialSource };

/** Why `fallback` cannot follow `primary` (`… speaks messages; this rule's backend speaks chat`), or null. */
export function fallbackMismatch(primary: ChainMember, fallback: ChainMember): string | null {
  if (fallback.dialect !== primary.dialect) return `speaks ${fallback.dialect}; this rule's backend speaks ${primary.dialect}`;
  if (fallback.credential_source !== primary.credential_source) {
    return `takes the ${fallback.credential_source}'s credential; this rule's backend takes the ${primary.credential_source}'s`;
  }
  return null;
}

/**
 * The first rule whose chain the backend `edited`, changed as given, would break, named with
 * the reason; null when every rule using it (as backend or fallback) stays valid.
 */
export async function chainBrokenByEdit(db: Db, namespaceId: string, edited: ChainMember & { id: string }): Promise<string | null> {
  const rules = (await rulesUsingBackend(db, edited.id)).filter((r) => r.fallback_backend_ids.length > 0);
  if (rules.length === 0) return null;
  const backends = new Map((await listBackends(db, namespaceId)).map((b) => [b.id, b]));
  const member = (id: string) => (id === edited.id ? { ...backends.get(id)!, ...edited } : backends.get(id));
  for (const r of rules) {
    const primary = member(r.backend_id!);
    if (!primary) continue;
    for (const id of r.fallback_backend_ids) {
      const fallback = member(id);
      const why = fallback ? fallbackMismatch(primary, fallback) : null;
      if (why !== null) {
        return `After this change, routing rule ${JSON.stringify(r.model)} (${r.id}) would fall back from backend ${JSON.stringify(primary.name)} to ${JSON.stringify(fallback!.name)}, which ${why}.`;
      }
    }
  }
  return null;
}
