// Routing rules: all of their SQL.
import type { Db } from './tenancies.ts';
import type { BackendForCall, BackendKind, CredentialSource, Dialect } from './backends.ts';
import type { Rule, RuleAction } from '../core/routing.ts';

export type RuleRow = {
  id: string;
  namespace_id: string;
  model: string;
  backend_id: string | null;
  fallback_backend_ids: string[];
  rewrite_model: string | null;
  priority: number;
  action: RuleAction;
  created_at: Date;
};

export type RuleFields = {
  model: string;
  backend_id: string | null;
  /** Left out: none at creation, unchanged at an update. */
  fallback_backend_ids?: string[];
  rewrite_model: string | null;
  priority: number;
  action: RuleAction;
};

const COLUMNS = 'id, namespace_id, model, backend_id, fallback_backend_ids, rewrite_model, priority, action, created_at';

export async function insertRule(db: Db, r: RuleFields & { id: string; namespace_id: string }): Promise<RuleRow> {
  const { rows } = await db.query<RuleRow>(
    `INSERT INTO sarsen.routing_rules (id, namespace_id, model, backend_id, rewrite_model, priority, action, fallback_backend_ids)
     VALUES ($1, $2, $3, $4, $5, $6, $7, coalesce($8::text[], '{}')) RETURNING ${COLUMNS}`,
    [r.id, r.namespace_id, r.model, r.backend_id, r.rewrite_model, r.priority, r.action, r.fallback_backend_ids ?? null],
  );
  return rows[0]!;
}

export async function findRule(db: Db, namespaceId: string, id: string, forUpdate = false): Promise<RuleRow | null> {
  const { rows } = await db.query<RuleRow>(
    `SELECT ${COLUMNS} FROM sarsen.routing_rules WHERE namespace_id = $1 AND id = $2${forUpdate ? ' FOR UPDATE' : ''}`,
    [namespaceId, id],
  );
  return rows[0] ?? null;
}

export async function listRules(db: Db, namespaceId: string): Promise<RuleRow[]> {
  const { rows } = await db.query<RuleRow>(
    `SELECT ${COLUMNS} FROM sarsen.routing_rules WHERE namespace_id = $1 ORDER BY created_at, id`,
    [namespaceId],
  );
  return rows;
}

export async function updateRule(db: Db, namespaceId: string, id: string, r: RuleFields): Promise<RuleRow | null> {
  const { rows } = await db.query<RuleRow>(
    `UPDATE sarsen.routing_rules SET model = $3, backend_id = $4, rewrite_model = $5, priority = $6, action = $7,
            fallback_backend_ids = coalesce($8::text[], fallback_backend_ids)
     WHERE namespace_id = $1 AND id = $2 RETURNING ${COLUMNS}`,
    [namespaceId, id, r.model, r.backend_id, r.rewrite_model, r.priority, r.action, r.fallback_backend_ids ?? null],
  );
  return rows[0] ?? null;
}

export async function deleteRule(db: Db, namespaceId: string, id: string): Promise<boolean> {
  const { rowCount } = await db.query('DELETE FROM sarsen.routing_rules WHERE namespace_id = $1 AND id = $2', [namespaceId, id]);
  return rowCount === 1;
}

/** The rules that route to a backend or fall back to it, oldest first. */
export async function rulesUsingBackend(db: Db, backendId: string): Promise<RuleRow[]> {
  const { rows } = await db.query<RuleRow>(
    `SELECT ${COLUMNS} FROM sarsen.routing_rules WHERE backend_id = $1 OR $1 = ANY(fallback_backend_ids) ORDER BY created_at, id`,
    [backendId],
  );
  return rows;
}

export type RoutingEntry = { rule: Rule; backend: BackendForCall | null };

/** A namespace's rules, in the shape routing matches them, with the backends they route to, in one consistent read. */
export async function loadRouting(db: Db, namespaceId: string): Promise<RoutingEntry[]> {
  const { rows } = await db.query<
    Rule & {
      namespace_id: string;
      b_id: string | null;
      b_kind: BackendKind | null;
      b_dialect: Dialect | null;
      b_address: string | null;
      b_credential_source: CredentialSource | null;
      b_credential_sealed: Buffer | null;
    }
  >(
    `SELECT r.id AS rule_id, r.namespace_id, r.model, r.backend_id, r.fallback_backend_ids, r.rewrite_model, r.priority, r.action, r.created_at,
            b.id AS b_id, b.kind AS b_kind, b.dialect AS b_dialect, b.address AS b_address,
            b.credential_source AS b_credential_source, b.credential_sealed AS b_credential_sealed
       FROM sarsen.routing_rules r LEFT JOIN sarsen.backends b ON b.id = r.backend_id
      WHERE r.namespace_id = $1`,
    [namespaceId],
  );
  return rows.map(({ namespace_id, b_id, b_kind, b_dialect, b_address, b_credential_source, b_credential_sealed, ...rule }) => ({
    rule,
    backend:
      b_id === null
        ? null
        : {
            backend_id: b_id,
            namespace_id,
            kind: b_kind!,
            dialect: b_dialect!,
            address: b_address!,
            credential_source: b_credential_source!,
            credential_sealed: b_credential_sealed,
          },
  }));
}
