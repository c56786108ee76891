// Tenancies, their console accounts and console sessions: all of their SQL.
import type { Pool, PoolClient } from './pool.ts';

export type Db = Pool | PoolClient;

export type TenancyRow = {
  id: string;
  slug: string;
  display_name: string;
  retention_minutes: number | null;
  created_at: Date;
};

export type Role = 'owner' | 'admin' | 'viewer';

export type UserRow = {
  id: string;
  tenancy_id: string;
  email: string;
  password_hash: string;
  password_chosen: boolean;
  role: Role;
  disabled: boolean;
  created_at: Date;
};

/** What a console request knows about its caller once the session checks out. */
export type SessionUser = {
  user_id: string;
  email: string;
  role: Role;
  password_chosen: boolean;
  tenancy_id: string;
  tenancy_slug: string;
};

const TENANCY_COLUMNS = 'id, slug, display_name, retention_minutes, created_at';
const USER_COLUMNS = 'id, tenancy_id, email, password_hash, password_chosen, role, disabled, created_at';

export async function insertTenancy(db: Db, t: { id: string; slug: string; display_name: string }): Promise<TenancyRow> {
  const { rows } = await db.query<TenancyRow>(
    `INSERT INTO sarsen.tenancies (id, slug, display_name) VALUES ($1, $2, $3) RETURNING ${TENANCY_COLUMNS}`,
    [t.id, t.slug, t.display_name],
  );
  return rows[0]!;
}

export async function findTenancyBySlug(db: Db, slug: string): Promise<TenancyRow | null> {
  const { rows } = await db.query<TenancyRow>(`SELECT ${TENANCY_COLUMNS} FROM sarsen.tenancies WHERE slug = $1`, [slug]);
  return rows[0] ?? null;
}

export async function findTenancy(db: Db, id: string): Promise<TenancyRow | null> {
  const { rows } = await db.query<TenancyRow>(`SELECT ${TENANCY_COLUMNS} FROM sarsen.tenancies WHERE id = $1`, [id]);
  return rows[0] ?? null;
}

export async function anyTenancyExists(db: Db): Promise<boolean> {
  const { rows } = await db.query('SELECT 1 FROM sarsen.tenancies LIMIT 1');
  return rows.length > 0;
}

/** Applies the fields present in `patch` (undefined = leave alone). */
export async function updateTenancy(
  db: Db,
  id: string,
  patch: { display_name?: string; retention_minutes?: number | null },
): Promise<TenancyRow | null> {
  const { rows } = await db.query<TenancyRow>(
    `UPDATE sarsen.tenancies SET
       display_name = CASE WHEN $2 THEN $3 ELSE display_name END,
       retention_minutes = CASE WHEN $4 THEN $5::integer ELSE retention_minutes END
     WHERE id = $1 RETURNING ${TENANCY_COLUMNS}`,
    [id, patch.display_name !== undefined, patch.display_name ?? null, patch.retention_minutes !== undefined, patch.retention_minutes ?? null],
  );
  return rows[0] ?? null;
}

export async function insertUser(
  db: Db,
  u: { id: string; tenancy_id: string; email: string; password_hash: string; role: Role; password_chosen?: boolean },
): Promise<UserRow> {
  const { rows } = await db.query<UserRow>(
    `INSERT INTO sarsen.users (id, tenancy_id, email, password_hash, role, password_chosen)
     VALUES ($1, $2, $3, $4, $5, $6) RETURNING ${USER_COLUMNS}`,
    [u.id, u.tenancy_id, u.email, u.password_hash, u.role, u.password_chosen ?? false],
  );
  return rows[0]!;
}

/** The account signing in: by tenancy slug and (lower-cased) email. */
export async function findUserForSignIn(db: Db, tenancySlug: string, email: string): Promise<UserRow | null> {
  const { rows } = await db.query<UserRow>(
    `SELECT ${USER_COLUMNS.split(', ').map((c) => `u.${c}`).join(', ')}
       FROM sarsen.users u JOIN sarsen.tenancies t ON t.id = u.tenancy_id
      WHERE t.slug = $1 AND u.email = $2`,
    [tenancySlug, email],
  );
  return rows[0] ?? null;
}

export async function findUser(db: Db, tenancyId: string, userId: string): Promise<UserRow | null> {
  const { rows } = await db.query<UserRow>(
    `SELECT ${USER_COLUMNS} FROM sarsen.users WHERE tenancy_id = $1 AND id = $2`,
    [tenancyId, userId],
  );
  return rows[0] ?? null;
}

export async function listUsers(db: Db, tenancyId: string): Promise<UserRow[]> {
  const { rows } = await db.query<UserRow>(
    `SELECT ${USER_COLUMNS} FROM sarsen.users WHERE tenancy_id = $1 ORDER BY created_at, id`,
    [tenancyId],
  );
  return rows;
}

/** Locks the tenancy's user rows, so the last-owner check and the change it guards are atomic. */
export async function lockActiveOwners(db: Db, tenancyId: string): Promise<string[]> {
  const { rows } = await db.query<{ id: string }>(
    `SELECT id FROM sarsen.users WHERE tenancy_id = $1 ORDER BY id FOR UPDATE`,
    [tenancyId],
  );
  if (rows.length === 0) return [];
  const owners = await db.query<{ id: string }>(
    `SELECT id FROM sarsen.users WHERE tenancy_id = $1 AND role = 'owner' AND NOT disabled`,
    [tenancyId],
  );
  return owners.rows.map((r) => r.id);
}

export async function updateUser(
  db: Db,
  tenancyId: string,
  userId: string,
  patch: { role?: Role; disabled?: boolean },
): Promise<UserRow | null> {
  const { rows } = await db.query<UserRow>(
    `UPDATE sarsen.users SET
       role = COALESCE($3, role),
       disabled = COALESCE($4, disabled)
     WHERE tenancy_id = $1 AND id = $2 RETURNING ${USER_COLUMNS}`,
    [tenancyId, userId, patch.role ?? null, patch.disabled ?? null],
  );
  return rows[0] ?? null;
}

export async function deleteUser(db: Db, tenancyId: string, userId: string): Promise<boolean> {
  const { rowCount } = await db.query('DELETE FROM sarsen.users WHERE tenancy_id = $1 AND id = $2', [tenancyId, userId]);
  return rowCount === 1;
}

export async function setPassword(db: Db, userId: string, passwordHash: string, chosen: boolean): Promise<void> {
  await db.query('UPDATE sarsen.users SET password_hash = $2, password_chosen = $3 WHERE id = $1', [userId, passwordHash, chosen]);
}

/** Stores a session that expires `ttlSeconds` from now (database time); answers the expiry. */
export async function insertSession(db: Db, s: { token_hash: Buffer; user_id: string; ttl_seconds: number }): Promise<Date> {
  const { rows } = await db.query<{ expires_at: Date }>(
    `INSERT INTO sarsen.sessions (token_hash, user_id, expires_at)
     VALUES ($1, $2, now() + make_interval(secs => $3)) RETURNING expires_at`,
    [s.token_hash, s.user_id, s.ttl_seconds],
  );
  return rows[0]!.expires_at;
}

/** The live session's account, provided it is enabled; expiry is judged by database time. */
export async function findSessionUser(db: Db, tokenHash: Buffer): Promise<SessionUser | null> {
  const { rows } = await db.query<SessionUser>(
    `SELECT u.id AS user_id, u.email, u.role, u.password_chosen, t.id AS tenancy_id, t.slug AS tenancy_slug
       FROM sarsen.sessions s
       JOIN sarsen.users u ON u.id = s.user_id
       JOIN sarsen.tenancies t ON t.id = u.tenancy_id
      WHERE s.token_hash = $1 AND s.expires_at > now() AND NOT u.disabled`,
    [tokenHash],
  );
  return rows[0] ?? null;
}

export async function deleteSession(db: Db, tokenHash: Buffer): Promise<void> {
  await db.query('DELETE FROM sarsen.sessions WHERE token_hash = $1', [tokenHash]);
}

/** Ends every session of a user except `keep` (after a password change, a disable). */
export async function deleteUserSessions(db: Db, userId: string, keep: Buffer | null = null): Promise<void> {
  await db.query('DELETE FROM sarsen.sessions WHERE user_id = $1 AND ($2::bytea IS NULL OR token_hash <> $2)', [userId, keep]);
}

export async function deleteExpiredSessions(db: Db, userId: string): Promise<void> {
  await db.query('DELETE FROM sarsen.sessions WHERE user_id = $1 AND expires_at <= now()', [userId]);
}

/** Serialises first-run bootstraps across processes for the rest of the transaction. */
export async function lockBootstrap(db: PoolClient): Promise<void> {
  // An arbitrary, fixed key: "sarsen bootstrap".
  await db.query('SELECT pg_advisory_xact_lock($1)', [(0x5a7e_3100_0002n).toString()]);
}
