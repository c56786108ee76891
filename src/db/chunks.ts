// Writing stream frames (DESIGN.md "Chunks"): one statement per chunk-writer flush stores the
// frames of every live stream of a process. Readers are in requests.ts.
import type { Pool } from './pool.ts';
import { prepared } from './pool.ts';
import { addToRollup, WRITER_SHARD } from './counters.ts';
import { notifyEvents } from './events.ts';

export type FrameRow = { requestId: string; attempt: number; seq: number; frame: Buffer };

const STORE = prepared(
  'sarsen_store_frames',
  `WITH input AS (
  SELECT * FROM unnest($1::text[], $2::int[], $3::int[], $4::bytea[]) AS t(request_id, attempt, seq, frame)
), fenced AS (
  -- Locked, so a recovery cannot slip in between this check and the insert.
  SELECT i.* FROM input i
    JOIN sarsen.requests q ON q.id = i.request_id AND q.attempts = i.attempt AND q.status = 'running'
   WHERE q.id = ANY($1::text[])
     FOR UPDATE OF q
), ins AS (
  INSERT INTO sarsen.chunks (request_id, seq, attempt, frame)
  SELECT request_id, seq, attempt, frame FROM fenced
  RETURNING request_id, seq, octet_length(frame) AS bytes
), per_request AS (
  SELECT request_id, max(seq) AS seq, sum(bytes) AS bytes FROM ins GROUP BY request_id
), bumped AS (
  UPDATE sarsen.requests q
     SET chunk_bytes = q.chunk_bytes + p.bytes, seq_high = greatest(q.seq_high, p.seq)
    FROM per_request p WHERE q.id = p.request_id AND q.id = ANY($1::text[])
  RETURNING q.namespace_id, p.bytes
), stored AS (
  ${addToRollup(['chunk_bytes'], `SELECT namespace_id, sum(bytes) AS chunk_bytes FROM bumped GROUP BY namespace_id`, '$5')}
  RETURNING 1
), notified AS (
  ${notifyEvents(`SELECT request_id, 'frames' AS event, seq AS arg FROM per_request`, '$6')}
)
SELECT p.request_id, p.seq, (SELECT count(*) FROM notified) + (SELECT count(*) FROM stored) AS side_effects
  FROM per_request p`,
);

/**
 * Group commit of stream frames: stores the frames whose attempt still holds its request (the
 * fence), advances each request's byte count and sequence high-water mark, and announces the
 * newest sequence per request on the bus. Answers the newest stored sequence per request; a
 * request missing from the answer was fenced out.
 */
export async function storeFrames(pool: Pool, frames: readonly FrameRow[], origin: string): Promise<Map<string, number>> {
  const { rows } = await pool.query<{ request_id: string; seq: number }>(
    STORE([frames.map((f) => f.requestId), frames.map((f) => f.attempt), frames.map((f) => f.seq), frames.map((f) => f.frame), WRITER_SHARD.frames, origin]),
  );
  return new Map(rows.map((r) => [r.request_id, r.seq]));
}
