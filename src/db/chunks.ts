// Stream frames (DESIGN.md "Chunks"), stored packed (migration 007): one row per chunk-writer
// flush and attempt, holding that flush's frames of the attempt back to back. Writers hand
// over single frames and readers get single frames; the packing lives here.
import type { Pool } from './pool.ts';
import { prepared } from './pool.ts';
import type { ChunkRow } from './requests.ts';
import { addToRollup, WRITER_SHARD } from './counters.ts';
import { notifyEvents } from './events.ts';
import { arrayLiteral, binaryColumn, binarySlice, fromBase64, type Element } from './columns.ts';

export type FrameRow = { requestId: string; attempt: number; seq: number; frame: Buffer };

type Packed = { requestId: string; attempt: number; lastSeq: number; frames: Buffer[]; bytes: number };

// A stored row holds at most about this much (a reader's page is a few rows; see readFrames).
const MAX_ROW_BYTES = 64 * 1024;

/** Consecutive frames of one attempt become one row, up to MAX_ROW_BYTES (in the order given, which is each stream's own). */
function pack(frames: readonly FrameRow[]): Packed[] {
  const runs = new Map<string, Packed[]>();
  for (const f of frames) {
    let own = runs.get(f.requestId);
    if (!own) runs.set(f.requestId, (own = []));
    const run = own[own.length - 1];
    if (run && run.attempt === f.attempt && run.lastSeq + 1 === f.seq && run.bytes + f.frame.length <= MAX_ROW_BYTES) {
      run.frames.push(f.frame);
      run.lastSeq = f.seq;
      run.bytes += f.frame.length;
    } else own.push({ requestId: f.requestId, attempt: f.attempt, lastSeq: f.seq, frames: [f.frame], bytes: f.frame.length });
  }
  return [...runs.values()].flat();
}

const STORE = prepared(
  'sarsen_store_frames',
  `WITH input AS (
  SELECT t.request_id, t.attempt, t.last_seq, t.lengths, ${binarySlice('$4::bytea', 't.size', 't.ord')} AS frames
    FROM unnest($1::text[], $2::int[], $3::int[], $5::int[], $6::text[]) WITH ORDINALITY AS t(request_id, attempt, last_seq, size, lengths, ord)
), fenced AS (
  -- The fence: frames are stored only while their attempt holds the request. The share lock
  -- keeps a recovery (which takes the row for update) from slipping in before this commits.
  SELECT q.id, q.namespace_id FROM sarsen.requests q
    JOIN (SELECT DISTINCT request_id, attempt FROM input) AS i ON q.id = i.request_id AND q.attempts = i.attempt
   WHERE q.id = ANY($1::text[]) AND q.status = 'running'
     FOR SHARE OF q
), ins AS (
  -- A flush repeated because its commit's answer was lost finds its rows stored: they count as
  -- stored (xmax = 0 tells an insert from the no-op update), and their bytes are counted once.
  INSERT INTO sarsen.chunks AS k (request_id, last_seq, attempt, frames, frame_lengths)
  SELECT i.request_id, i.last_seq, i.attempt, i.frames, i.lengths::int[] FROM input i JOIN fenced f ON f.id = i.request_id
  ON CONFLICT (request_id, last_seq) DO UPDATE SET attempt = k.attempt
   WHERE k.attempt = EXCLUDED.attempt AND k.frames = EXCLUDED.frames
  RETURNING request_id, attempt, last_seq, CASE WHEN k.xmax = 0 THEN octet_length(frames) ELSE 0 END AS bytes
), per_request AS (
  SELECT request_id, attempt, max(last_seq) AS seq, sum(bytes) AS bytes FROM ins GROUP BY request_id, attempt
), stored AS (
  ${addToRollup(['chunk_bytes'], `SELECT f.namespace_id, sum(p.bytes) AS chunk_bytes FROM per_request p JOIN fenced f ON f.id = p.request_id GROUP BY f.namespace_id`, '$7')}
  RETURNING 1
), notified AS (
  ${notifyEvents(`SELECT request_id, 'frames' AS event, seq AS arg FROM per_request`, '$8')}
)
SELECT p.request_id, p.attempt, p.seq, (SELECT count(*) FROM notified) + (SELECT count(*) FROM stored) AS side_effects
  FROM per_request p`,
);

export type Stored = Map<string, { attempt: number; seq: number }>;

/**
 * Group commit of stream frames: stores the frames whose attempt still holds its request (the
 * fence), adds their bytes to the namespace's storage, and announces the newest sequence per
 * request on the bus. Answers, per request, the attempt whose frames were stored and its newest
 * sequence; frames of any other attempt were fenced out. (A request's own byte count and
 * sequence high-water mark are written with its terminal state, or by the recovery that
 * discards its frames.)
 */
export async function storeFrames(pool: Pool, frames: readonly FrameRow[], origin: string): Promise<Stored> {
  const rows = pack(frames);
  const col = (f: (p: Packed) => Element) => arrayLiteral(rows.map(f));
  const bytes = binaryColumn(rows.map((p) => (p.frames.length === 1 ? p.frames[0]! : Buffer.concat(p.frames))));
  const lengths = col((p) => (p.frames.length === 1 ? null : `{${p.frames.map((f) => f.length).join(',')}}`));
  const { rows: stored } = await pool.query<{ request_id: string; attempt: number; seq: number }>(
    STORE([col((p) => p.requestId), col((p) => p.attempt), col((p) => p.lastSeq), bytes.data, bytes.sizes, lengths, WRITER_SHARD.frames, origin]),
  );
  return new Map(stored.map((r) => [r.request_id, { attempt: r.attempt, seq: r.seq }]));
}

type StoredRow = { last_seq: number; attempt: number; frames: Buffer; frame_lengths: number[] | null };

/** The frames of a stored row, each with its sequence number. */
function unpack(row: StoredRow): ChunkRow[] {
  const lengths = row.frame_lengths ?? [row.frames.length];
  const out: ChunkRow[] = [];
  let at = 0;
  let seq = row.last_seq - lengths.length + 1;
  for (const length of lengths) {
    out.push({ seq: seq++, attempt: row.attempt, frame: row.frames.subarray(at, at + length) });
    at += length;
  }
  return out;
}

const READ = prepared(
  'sarsen_read_frames',
  `SELECT last_seq, attempt, encode(frames, 'base64') AS frames, frame_lengths FROM (
     SELECT last_seq, attempt, frames, frame_lengths,
            sum(octet_length(frames)) OVER (ORDER BY last_seq) - octet_length(frames) AS bytes_before
       FROM sarsen.chunks WHERE request_id = $1 AND last_seq > $2 ORDER BY last_seq LIMIT $3
   ) AS page
   WHERE bytes_before < $4
   ORDER BY last_seq`,
);

/**
 * Stored frames after `afterSeq`, in order: a page of at most `rows` stored rows and about
 * `maxBytes` (at least one row), so a reader holds a page of a stream, never all of it. `more`
 * says the page was cut (there may be more).
 */
export async function readFrames(
  pool: Pool,
  requestId: string,
  afterSeq: number,
  page: { rows: number; maxBytes: number },
): Promise<{ frames: ChunkRow[]; more: boolean }> {
  const { rows } = await pool.query<Omit<StoredRow, 'frames'> & { frames: string }>(READ([requestId, afterSeq, page.rows, page.maxBytes]));
  const stored: StoredRow[] = rows.map((r) => ({ ...r, frames: fromBase64(r.frames)! }));
  const bytes = stored.reduce((n, r) => n + r.frames.length, 0);
  return { frames: stored.flatMap(unpack).filter((f) => f.seq > afterSeq), more: stored.length === page.rows || bytes >= page.maxBytes };
}

/** Whether frame `seq` of the request is still stored (frames of a discarded attempt are not). */
export async function frameExists(pool: Pool, requestId: string, seq: number): Promise<boolean> {
  const { rowCount } = await pool.query(
    `SELECT 1 FROM (SELECT last_seq, frame_lengths FROM sarsen.chunks WHERE request_id = $1 AND last_seq >= $2 ORDER BY last_seq LIMIT 1) AS c
      WHERE c.last_seq - coalesce(cardinality(c.frame_lengths), 1) < $2`,
    [requestId, seq],
  );
  return rowCount === 1;
}
