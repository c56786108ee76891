// Backends: all of their SQL. The sealed credential is selected only by the functions that
// need to open it (a call to the provider); administration reads say whether one exists.
import type { Db } from './tenancies.ts';
import type { BackendDialect } from '../core/dialects.ts';

export type BackendKind = 'chat_compat' | 'messages' | 'aggregator';
/** A backend's dialect (its kind's): a chat backend also serves the responses dialect (core/dialects.ts). */
export type Dialect = BackendDialect;
export type CredentialSource = 'stored' | 'caller';

/** A backend as administration shows it: no credential bytes, only whether there are any. */
export type BackendRow = {
  id: string;
  namespace_id: string;
  name: string;
  kind: BackendKind;
  dialect: Dialect;
  address: string;
  credential_source: CredentialSource;
  has_credential: boolean;
  created_at: Date;
};

/** What a provider call needs. `credential_sealed` opens with openBackendCredential. */
export type BackendForCall = {
  backend_id: string;
  namespace_id: string;
  kind: BackendKind;
  dialect: Dialect;
  address: string;
  credential_source: CredentialSource;
  credential_sealed: Buffer | null;
};

const ADMIN_COLUMNS = `id, namespace_id, name, kind, dialect, address, credential_source,
                       credential_sealed IS NOT NULL AS has_credential, created_at`;
const CALL_COLUMNS = `id AS backend_id, namespace_id, kind, dialect, address, credential_source, credential_sealed`;

export async function insertBackend(
  db: Db,
  b: Omit<BackendRow, 'has_credential' | 'created_at'> & { credential_sealed: Buffer | null },
): Promise<BackendRow> {
  const { rows } = await db.query<BackendRow>(
    `INSERT INTO sarsen.backends (id, namespace_id, name, kind, dialect, address, credential_sealed, credential_source)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING ${ADMIN_COLUMNS}`,
    [b.id, b.namespace_id, b.name, b.kind, b.dialect, b.address, b.credential_sealed, b.credential_source],
  );
  return rows[0]!;
}

export async function findBackend(db: Db, namespaceId: string, id: string): Promise<BackendRow | null> {
  const { rows } = await db.query<BackendRow>(
    `SELECT ${ADMIN_COLUMNS} FROM sarsen.backends WHERE namespace_id = $1 AND id = $2`,
    [namespaceId, id],
  );
  return rows[0] ?? null;
}

/**
 * Locks the row: `update` for a read-modify-write (PATCH, DELETE); `share` for a rule that
 * names it, so an edit or a deletion waits for the rule and then sees it.
 */
export async function lockBackend(db: Db, namespaceId: string, id: string, mode: 'update' | 'share' = 'update'): Promise<BackendRow | null> {
  const { rows } = await db.query<BackendRow>(
    `SELECT ${ADMIN_COLUMNS} FROM sarsen.backends WHERE namespace_id = $1 AND id = $2 FOR ${mode === 'update' ? 'UPDATE' : 'SHARE'}`,
    [namespaceId, id],
  );
  return rows[0] ?? null;
}

export async function listBackends(db: Db, namespaceId: string): Promise<BackendRow[]> {
  const { rows } = await db.query<BackendRow>(
    `SELECT ${ADMIN_COLUMNS} FROM sarsen.backends WHERE namespace_id = $1 ORDER BY created_at, id`,
    [namespaceId],
  );
  return rows;
}

/**
 * Writes a backend's new state. `credential_sealed`: undefined leaves it, null removes it,
 * bytes replace it.
 */
export async function updateBackend(
  db: Db,
  namespaceId: string,
  id: string,
  b: {
    name: string;
    kind: BackendKind;
    dialect: Dialect;
    address: string;
    credential_source: CredentialSource;
    credential_sealed?: Buffer | null;
  },
): Promise<BackendRow | null> {
  const { rows } = await db.query<BackendRow>(
    `UPDATE sarsen.backends SET
       name = $3, kind = $4, dialect = $5, address = $6, credential_source = $7,
       credential_sealed = CASE WHEN $8 THEN $9::bytea ELSE credential_sealed END
     WHERE namespace_id = $1 AND id = $2 RETURNING ${ADMIN_COLUMNS}`,
    [namespaceId, id, b.name, b.kind, b.dialect, b.address, b.credential_source, b.credential_sealed !== undefined, b.credential_sealed ?? null],
  );
  return rows[0] ?? null;
}

/** False when no such backend. Routing rules that use it make this throw (23503, a conflict). */
export async function deleteBackend(db: Db, namespaceId: string, id: string): Promise<boolean> {
  const { rowCount } = await db.query('DELETE FROM sarsen.backends WHERE namespace_id = $1 AND id = $2', [namespaceId, id]);
  return rowCount === 1;
}

/** The executor's read: one backend by id, with its sealed credential. */
export async function loadBackendForCall(db: Db, backendId: string): Promise<BackendForCall | null> {
  const { rows } = await db.query<BackendForCall>(`SELECT ${CALL_COLUMNS} FROM sarsen.backends WHERE id = $1`, [backendId]);
  return rows[0] ?? null;
}
