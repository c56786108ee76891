// Namespaces: all of their SQL. Every lookup is scoped by tenancy, so another tenancy's
// namespace is simply not found.
import type { Db } from './tenancies.ts';

export type NamespaceRow = {
  id: string;
  tenancy_id: string;
  name: string;
  retention_minutes: number | null;
  spend_limit: number | null;
  cache_ttl_minutes: number | null;
  created_at: Date;
  /** The tenancy's horizon, joined in so effective retention needs no second query. */
  tenancy_retention_minutes: number | null;
};

const SELECT = `SELECT n.id, n.tenancy_id, n.name, n.retention_minutes, n.spend_limit, n.cache_ttl_minutes, n.created_at,
                       t.retention_minutes AS tenancy_retention_minutes
                  FROM sarsen.namespaces n JOIN sarsen.tenancies t ON t.id = n.tenancy_id`;

export async function insertNamespace(
  db: Db,
  n: { id: string; tenancy_id: string; name: string; retention_minutes: number | null; spend_limit: number | null; cache_ttl_minutes?: number | null },
): Promise<NamespaceRow> {
  await db.query(
    `INSERT INTO sarsen.namespaces (id, tenancy_id, name, retention_minutes, spend_limit, cache_ttl_minutes) VALUES ($1, $2, $3, $4, $5, $6)`,
    [n.id, n.tenancy_id, n.name, n.retention_minutes, n.spend_limit, n.cache_ttl_minutes ?? null],
  );
  return (await findNamespaceById(db, n.id))!;
}

async function findNamespaceById(db: Db, id: string): Promise<NamespaceRow | null> {
  const { rows } = await db.query<NamespaceRow>(`${SELECT} WHERE n.id = $1`, [id]);
  return rows[0] ?? null;
}

export async function findNamespace(db: Db, tenancyId: string, name: string): Promise<NamespaceRow | null> {
  const { rows } = await db.query<NamespaceRow>(`${SELECT} WHERE n.tenancy_id = $1 AND n.name = $2`, [tenancyId, name]);
  return rows[0] ?? null;
}

export async function listNamespaces(db: Db, tenancyId: string): Promise<NamespaceRow[]> {
  const { rows } = await db.query<NamespaceRow>(`${SELECT} WHERE n.tenancy_id = $1 ORDER BY n.name`, [tenancyId]);
  return rows;
}

/** Applies the fields present in `patch` (undefined = leave alone, null = unset). */
export async function updateNamespace(
  db: Db,
  id: string,
  patch: { retention_minutes?: number | null; spend_limit?: number | null; cache_ttl_minutes?: number | null },
): Promise<NamespaceRow | null> {
  const { rowCount } = await db.query(
    `UPDATE sarsen.namespaces SET
       retention_minutes = CASE WHEN $2 THEN $3::integer ELSE retention_minutes END,
       spend_limit = CASE WHEN $4 THEN $5::bigint ELSE spend_limit END,
       cache_ttl_minutes = CASE WHEN $6 THEN $7::integer ELSE cache_ttl_minutes END
     WHERE id = $1`,
    [
      id,
      patch.retention_minutes !== undefined,
      patch.retention_minutes ?? null,
      patch.spend_limit !== undefined,
      patch.spend_limit ?? null,
      patch.cache_ttl_minutes !== undefined,
      patch.cache_ttl_minutes ?? null,
    ],
  );
  return rowCount === 1 ? findNamespaceById(db, id) : null;
}

/** Deletes the namespace with its backends, rules and keys (cascade). */
export async function deleteNamespace(db: Db, id: string): Promise<boolean> {
  const { rowCount } = await db.query('DELETE FROM sarsen.namespaces WHERE id = $1', [id]);
  return rowCount === 1;
}
