// API keys: all of their SQL. Administration reads never select the secret's hash; only the
// authentication lookup does.
import type { Db } from './tenancies.ts';

export type Grant = 'use' | 'manage';

export type ApiKeyRow = {
  id: string;
  namespace_id: string;
  name: string;
  prefix: string;
  grants: Grant[];
  spend_limit: number | null;
  requests_per_minute: number | null;
  tokens_per_minute: number | null;
  created_at: Date;
  last_used_at: Date | null;
  revoked_at: Date | null;
};

/** A key's rate limits as stored; null: that limit is off. */
export type StoredLimits = { requests_per_minute: number | null; tokens_per_minute: number | null };

/** Everything authentication needs about a key, found by its public prefix. */
export type KeyForAuth = {
  api_key_id: string;
  prefix: string;
  secret_hash: Buffer;
  grants: Grant[];
  revoked: boolean;
  namespace_id: string;
  namespace_name: string;
  tenancy_id: string;
  tenancy_slug: string;
  requests_per_minute: number | null;
  tokens_per_minute: number | null;
  /** The namespace's response cache life, null when it has none. */
  cache_ttl_minutes: number | null;
};

const COLUMNS = 'id, namespace_id, name, prefix, grants, spend_limit, requests_per_minute, tokens_per_minute, created_at, last_used_at, revoked_at';

export async function insertApiKey(
  db: Db,
  k: { id: string; namespace_id: string; name: string; prefix: string; secret_hash: Buffer; grants: Grant[]; spend_limit: number | null } & Partial<StoredLimits>,
): Promise<ApiKeyRow> {
  const { rows } = await db.query<ApiKeyRow>(
    `INSERT INTO sarsen.api_keys (id, namespace_id, name, prefix, secret_hash, grants, spend_limit, requests_per_minute, tokens_per_minute)
     VALUES ($1, $2, $3, $4, $5, $6::text[], $7, $8, $9) RETURNING ${COLUMNS}`,
    [k.id, k.namespace_id, k.name, k.prefix, k.secret_hash, k.grants, k.spend_limit, k.requests_per_minute ?? null, k.tokens_per_minute ?? null],
  );
  return rows[0]!;
}

/** Sets a live key's rate limits (its trigger tells every process's key cache). Null when no such live key. */
export async function setApiKeyLimits(db: Db, namespaceId: string, id: string, limits: StoredLimits): Promise<ApiKeyRow | null> {
  const { rows } = await db.query<ApiKeyRow>(
    `UPDATE sarsen.api_keys SET requests_per_minute = $3, tokens_per_minute = $4
      WHERE namespace_id = $1 AND id = $2 AND revoked_at IS NULL RETURNING ${COLUMNS}`,
    [namespaceId, id, limits.requests_per_minute, limits.tokens_per_minute],
  );
  return rows[0] ?? null;
}

export async function findApiKey(db: Db, namespaceId: string, id: string): Promise<ApiKeyRow | null> {
  const { rows } = await db.query<ApiKeyRow>(`SELECT ${COLUMNS} FROM sarsen.api_keys WHERE namespace_id = $1 AND id = $2`, [
    namespaceId,
    id,
  ]);
  return rows[0] ?? null;
}

export async function listApiKeys(db: Db, namespaceId: string): Promise<ApiKeyRow[]> {
  const { rows } = await db.query<ApiKeyRow>(
    `SELECT ${COLUMNS} FROM sarsen.api_keys WHERE namespace_id = $1 ORDER BY created_at, id`,
    [namespaceId],
  );
  return rows;
}

/** Revokes (idempotently: a second revocation keeps the first time). Null when no such key. */
export async function revokeApiKey(db: Db, namespaceId: string, id: string): Promise<ApiKeyRow | null> {
  const { rows } = await db.query<ApiKeyRow>(
    `UPDATE sarsen.api_keys SET revoked_at = COALESCE(revoked_at, now())
      WHERE namespace_id = $1 AND id = $2 RETURNING ${COLUMNS}`,
    [namespaceId, id],
  );
  return rows[0] ?? null;
}

export async function findKeyForAuth(db: Db, prefix: string): Promise<KeyForAuth | null> {
  const { rows } = await db.query<KeyForAuth>(
    `SELECT k.id AS api_key_id, k.prefix, k.secret_hash, k.grants, k.revoked_at IS NOT NULL AS revoked,
            n.id AS namespace_id, n.name AS namespace_name, t.id AS tenancy_id, t.slug AS tenancy_slug,
            k.requests_per_minute, k.tokens_per_minute, n.cache_ttl_minutes
       FROM sarsen.api_keys k
       JOIN sarsen.namespaces n ON n.id = k.namespace_id
       JOIN sarsen.tenancies t ON t.id = n.tenancy_id
      WHERE k.prefix = $1`,
    [prefix],
  );
  return rows[0] ?? null;
}

/** One set-based write for a batch of last-used times; never moves a time backwards. */
export async function recordKeysUsed(db: Db, used: ReadonlyMap<string, Date>): Promise<void> {
  if (used.size === 0) return;
  await db.query(
    `UPDATE sarsen.api_keys AS k SET last_used_at = GREATEST(k.last_used_at, u.at)
       FROM unnest($1::text[], $2::timestamptz[]) AS u(id, at)
      WHERE k.id = u.id`,
    [[...used.keys()], [...used.values()]],
  );
}
