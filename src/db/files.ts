// The SQL of files (docs/api.md "Batches"): an upload's bytes as sent, in pieces of up to
// 1 MiB written as they arrive, so memory never holds a whole file; the rows of a batch's output
// and error files, whose content and size are built from its lines when read.
import type { Pool, PoolClient } from './pool.ts';
import { prepared } from './pool.ts';
import { batchFileBytesSql } from './batches.ts';

type Db = Pick<Pool, 'query'>;

export type FileRow = {
  id: string;
  namespace_id: string;
  purpose: string;
  filename: string;
  bytes: number;
  batch_id: string | null;
  kind: 'output' | 'error' | null;
  created_at: Date;
};

// A batch's output or error file is sized from its lines when read (its stored bytes are null);
// files of batches that ended before migration 031 keep the bytes recorded then.
const COLUMNS = `f.id, f.namespace_id, f.purpose, f.filename, coalesce(f.bytes, ${batchFileBytesSql('f')})::float8 AS bytes, f.batch_id, f.kind, f.created_at`;

/** An upload in progress, inside the caller's transaction: pieces in order, then the total. */
export async function startFile(c: PoolClient, f: { id: string; tenancyId: string; namespaceId: string; filename: string }): Promise<void> {
  await c.query(`INSERT INTO sarsen.files (id, tenancy_id, namespace_id, purpose, filename) VALUES ($1, $2, $3, 'batch', $4)`, [f.id, f.tenancyId, f.namespaceId, f.filename]);
}

const PIECE = prepared('sarsen_file_piece', `INSERT INTO sarsen.file_chunks (file_id, seq, data) VALUES ($1, $2, $3)`);

export async function addFilePiece(c: PoolClient, fileId: string, seq: number, data: Buffer): Promise<void> {
  await c.query(PIECE([fileId, seq, data]));
}

export async function finishFile(c: PoolClient, fileId: string, f: { purpose: string; filename: string; bytes: number }): Promise<void> {
  await c.query(`UPDATE sarsen.files SET bytes = $2, purpose = $3, filename = $4 WHERE id = $1`, [fileId, f.bytes, f.purpose, f.filename]);
}

/** One piece of a file's bytes, or null past its last. */
export async function readFilePiece(db: Db, fileId: string, seq: number): Promise<Buffer | null> {
  const { rows } = await db.query<{ data: Buffer }>(`SELECT data FROM sarsen.file_chunks WHERE file_id = $1 AND seq = $2`, [fileId, seq]);
  return rows[0]?.data ?? null;
}

export async function findFile(db: Db, namespaceId: string, id: string): Promise<FileRow | null> {
  const { rows } = await db.query<FileRow>(`SELECT ${COLUMNS} FROM sarsen.files f WHERE f.id = $1 AND f.namespace_id = $2`, [id, namespaceId]);
  return rows[0] ?? null;
}

/** A page of the namespace's files, newest first (or oldest first), after the file `after`. */
export async function listFiles(
  db: Db,
  namespaceId: string,
  opts: { after: string | null; limit: number; order: 'asc' | 'desc'; purpose: string | null },
): Promise<FileRow[]> {
  const cmp = opts.order === 'asc' ? '>' : '<';
  const { rows } = await db.query<FileRow>(
    `SELECT ${COLUMNS} FROM sarsen.files f
      WHERE f.namespace_id = $1 AND ($2::text IS NULL OR f.id ${cmp} $2) AND ($3::text IS NULL OR f.purpose = $3)
      ORDER BY f.id ${opts.order} LIMIT $4`,
    [namespaceId, opts.after, opts.purpose, opts.limit],
  );
  return rows;
}

/** Deletes a file and its bytes; false when the namespace has no such file. */
export async function deleteFile(db: Db, namespaceId: string, id: string): Promise<boolean> {
  const { rows } = await db.query<{ n: number }>(
    `WITH gone AS (DELETE FROM sarsen.files WHERE id = $1 AND namespace_id = $2 RETURNING id),
          pieces AS (DELETE FROM sarsen.file_chunks WHERE file_id IN (SELECT id FROM gone) RETURNING 1)
     SELECT (SELECT count(*) FROM gone)::int AS n, (SELECT count(*) FROM pieces) AS p`,
    [id, namespaceId],
  );
  return rows[0]!.n === 1;
}

/** The bytes a namespace's uploads hold, and those of lines waiting to run (GET /storage). */
export async function batchStorage(db: Db, namespaceId: string): Promise<{ file_bytes: number; batch_bytes: number }> {
  const { rows } = await db.query<{ file_bytes: number; batch_bytes: number }>(
    `SELECT (SELECT coalesce(sum(bytes), 0) FROM sarsen.files WHERE namespace_id = $1 AND kind IS NULL)::float8 AS file_bytes,
            (SELECT coalesce(sum(octet_length(l.body)), 0) FROM sarsen.batches b JOIN sarsen.batch_lines l ON l.batch_id = b.id AND l.state = 'waiting'
              WHERE b.namespace_id = $1 AND b.ended_at IS NULL)::float8 AS batch_bytes`,
    [namespaceId],
  );
  return rows[0]!;
}

/**
 * The retention sweep's part (src/executor/retention.ts): files, and batches with their lines,
 * older than their namespace's retention go. The lines' requests go by their own retention.
 */
export async function sweepBatchStorage(db: Db, namespaceId: string, minutes: number, limit: number): Promise<number> {
  const { rows } = await db.query<{ n: number }>(
    `WITH old_files AS (
       SELECT id FROM sarsen.files WHERE namespace_id = $1 AND created_at < now() - make_interval(mins => $2) ORDER BY created_at LIMIT $3
     ), files AS (DELETE FROM sarsen.files WHERE id IN (SELECT id FROM old_files) RETURNING id),
     pieces AS (DELETE FROM sarsen.file_chunks WHERE file_id IN (SELECT id FROM files) RETURNING 1),
     old_batches AS (
       SELECT id FROM sarsen.batches WHERE namespace_id = $1 AND ended_at IS NOT NULL AND ended_at < now() - make_interval(mins => $2) LIMIT $3
     ), batches AS (DELETE FROM sarsen.batches WHERE id IN (SELECT id FROM old_batches) RETURNING id),
     lines AS (DELETE FROM sarsen.batch_lines WHERE batch_id IN (SELECT id FROM batches) RETURNING 1)
     SELECT ((SELECT count(*) FROM files) + (SELECT count(*) FROM batches))::int AS n, (SELECT count(*) FROM pieces) AS p, (SELECT count(*) FROM lines) AS l`,
    [namespaceId, minutes, limit],
  );
  return rows[0]!.n;
}
