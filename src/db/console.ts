// Reads only the console's routes need: a session's expiry, and a request's stored bodies
// exactly as stored (the record embeds the answer; these give the bytes themselves).
import type { Pool } from './pool.ts';
import { RETIRED } from './partitions.ts';

export async function sessionExpiry(pool: Pool, tokenHash: Buffer): Promise<Date | null> {
  const { rows } = await pool.query<{ expires_at: Date }>('SELECT expires_at FROM sarsen.sessions WHERE token_hash = $1', [tokenHash]);
  return rows[0]?.expires_at ?? null;
}

export type StoredBody = { expired: boolean; content_type: string | null; body: Buffer | null };

/**
 * One stored body of a request: the canonical request body as sent upstream, or the terminal
 * answer byte for byte. Null when the id is not this namespace's; `body` null when none is stored.
 */
export async function readStoredBody(pool: Pool, namespaceId: string, id: string, which: 'request' | 'answer'): Promise<StoredBody | null> {
  const { rows } = await pool.query<StoredBody>(
    which === 'request'
      ? `SELECT q.expired OR q.id < ${RETIRED} AS expired, 'application/json' AS content_type, convert_to(b.body, 'UTF8') AS body
           FROM sarsen.requests q LEFT JOIN sarsen.request_bodies b ON b.request_id = q.id
          WHERE q.id = $1 AND q.namespace_id = $2`
      : `SELECT q.expired OR q.id < ${RETIRED} AS expired, r.content_type, r.body
           FROM sarsen.requests q LEFT JOIN sarsen.responses r ON r.request_id = q.id
          WHERE q.id = $1 AND q.namespace_id = $2`,
    [id, namespaceId],
  );
  return rows[0] ?? null;
}
