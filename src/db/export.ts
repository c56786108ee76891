// Reads for the export (GET .../requests/export, `sarsen export`; docs/storage.md): a
// namespace's records oldest first through the listing's index, a page at a time, and their
// payloads in bounded pieces, so neither the database nor the exporter holds more than a page.
import type { Pool } from './pool.ts';
import { firstIdAt } from '../core/ids.ts';
import { LISTING_COLUMNS, LISTING_FROM, type ListingRow } from './accounting.ts';
import { oneOfIds } from './columns.ts';
import { STORED_ROW_COLUMNS, storedRow, type StoredRow } from './chunks.ts';

type Db = Pick<Pool, 'query'>;

/** A listing row, and the bytes its payloads hold (what reading them costs). */
export type ExportRow = ListingRow & { error_status: number | null; request_bytes: number; response_bytes: number; chunk_bytes: number };

// As in the listing: the id index bounds the scan, created_at is filtered exactly.
const CLOCK_SLACK_MS = 5 * 60_000;

/** Up to `limit` records after `after` (exclusive), created in [since, until), oldest first. */
export async function exportPage(db: Db, namespaceId: string, after: string | null, since: Date | null, until: Date, limit: number): Promise<ExportRow[]> {
  const { rows } = await db.query<ExportRow>(
    `SELECT ${LISTING_COLUMNS}, q.error_status, q.request_bytes, q.response_bytes, q.chunk_bytes FROM ${LISTING_FROM}
      WHERE q.namespace_id = $1 AND q.id > $2 AND q.id < $3 AND q.created_at >= $4 AND q.created_at < $5
      ORDER BY q.id LIMIT $6`,
    [
      namespaceId,
      after ?? (since ? firstIdAt('req', since.getTime() - CLOCK_SLACK_MS) : ''),
      firstIdAt('req', until.getTime() + CLOCK_SLACK_MS),
      since ?? new Date(0),
      until,
      limit,
    ],
  );
  return rows;
}

export type StoredPayload = {
  id: string;
  body: string | null;
  response_status: number | null;
  response_content_type: string | null;
  response_length: number | null;
  /** The answer as base64 when it is at most the inline size; else read with `answerSlice`. */
  response_base64: string | null;
};

/** The request bodies of `ids` and their answers (inline up to `inlineBytes`). */
export async function payloads(db: Db, ids: readonly string[], inlineBytes: number): Promise<StoredPayload[]> {
  const { rows } = await db.query<StoredPayload>(
    `SELECT i.id, b.body, r.status AS response_status, r.content_type AS response_content_type, octet_length(r.body) AS response_length,
            CASE WHEN octet_length(r.body) <= $2 THEN encode(r.body, 'base64') END AS response_base64
       FROM unnest($1::text[]) AS i(id)
       LEFT JOIN sarsen.request_bodies b ON b.request_id = i.id AND ${oneOfIds('b.request_id', '$1::text[]')}
       LEFT JOIN sarsen.responses r ON r.request_id = i.id AND ${oneOfIds('r.request_id', '$1::text[]')}`,
    [ids, inlineBytes],
  );
  return rows;
}

/** `length` bytes of a stored answer from byte `from` (0-based), as base64. */
export async function answerSlice(db: Db, id: string, from: number, length: number): Promise<string> {
  const { rows } = await db.query<{ slice: string | null }>(
    `SELECT encode(substring(body FROM $2 FOR $3), 'base64') AS slice FROM sarsen.responses WHERE request_id = $1`,
    [id, from + 1, length],
  );
  return rows[0]?.slice ?? '';
}

/**
 * Stored frame rows of `ids` after `(afterId, afterSeq)`, in order, at most `rows` of them: a
 * stream's rows read in order and decoded (createFrameReader) are its bytes as the provider sent them.
 */
export async function frameRows(db: Db, ids: readonly string[], after: { id: string; seq: number } | null, rows: number): Promise<(StoredRow & { request_id: string })[]> {
  const { rows: found } = await db.query<Omit<StoredRow, 'frames'> & { request_id: string; frames: string }>(
    `SELECT c.request_id, ${STORED_ROW_COLUMNS} FROM sarsen.chunks c
      WHERE ${oneOfIds('c.request_id', '$1::text[]')} AND (c.request_id, c.last_seq) > ($2, $3)
      ORDER BY c.request_id, c.last_seq LIMIT $4`,
    [ids, after?.id ?? '', after?.seq ?? -1, rows],
  );
  return found.map(storedRow);
}
