// Stream frames (docs/durability.md "Stream frames"), stored packed (migration 007): one row
// per chunk-writer flush and attempt, holding that flush's frames of the attempt back to back,
// each whole or as its difference from the frame before it (migration 034, src/core/frame-delta.ts).
// Writers hand over single frames and readers get single frames; the packing lives here.
import type { Pool } from './pool.ts';
import { prepared } from './pool.ts';
import type { ChunkRow } from './requests.ts';
import { addToRollup } from './counters.ts';
import { notifyEvents } from './events.ts';
import { isUniqueViolation } from './pg-errors.ts';
import { batchInput, bytesFrom, notBelowIds, oneOfIds, selectBytes, withParts, type Bytes } from './columns.ts';
import { decodeFrame, keyframeAtOrBefore, KEYFRAME_EVERY } from '../core/frame-delta.ts';

/** A frame to store: `frame` its bytes, `stored` how it is stored (createFrameEncoder, or wholeFrame). */
export type FrameRow = { requestId: string; attempt: number; seq: number; frame: Buffer; stored: Buffer };

type Packed = { requestId: string; attempt: number; lastSeq: number; stored: Buffer[]; bytes: number };

// A stored row holds at most about this much of frames, counted whole (a reader's page is a few
// rows, decoded; see readFrames).
const MAX_ROW_BYTES = 64 * 1024;

/** Consecutive frames of one attempt become one row, up to MAX_ROW_BYTES (in the order given, which is each stream's own). */
function pack(frames: readonly FrameRow[]): Packed[] {
  const runs = new Map<string, Packed[]>();
  for (const f of frames) {
    let own = runs.get(f.requestId);
    if (!own) runs.set(f.requestId, (own = []));
    const run = own[own.length - 1];
    if (run && run.attempt === f.attempt && run.lastSeq + 1 === f.seq && run.bytes + f.frame.length <= MAX_ROW_BYTES) {
      run.stored.push(f.stored);
      run.lastSeq = f.seq;
      run.bytes += f.frame.length;
    } else own.push({ requestId: f.requestId, attempt: f.attempt, lastSeq: f.seq, stored: [f.stored], bytes: f.frame.length });
  }
  return [...runs.values()].flat();
}

const STORE_INPUT = batchInput<Packed, { origin: string }>(
  [
    ['request_id', 'text', (p) => p.requestId],
    ['attempt', 'int', (p) => p.attempt],
    ['last_seq', 'int', (p) => p.lastSeq],
    ['frames', 'binary', (p) => (p.stored.length === 1 ? p.stored[0]! : Buffer.concat(p.stored))],
    // Each stored frame's length, as an int[] literal; NULL for a row of one frame.
    ['lengths', 'text', (p) => (p.stored.length === 1 ? null : `{${p.stored.map((f) => f.length).join(',')}}`)],
    ['bytes', 'int', (p) => p.bytes],
  ],
  { origin: 'text' },
);

/**
 * The flush of frames. `again`: the statement a flush runs after the plain one was refused by the
 * primary key, which looks up each row's sequence number first. The plain statement inserts
 * without looking (no ON CONFLICT either: a speculative insertion logs a second WAL record for
 * every row; docs/durability.md "Stream frames").
 */
function storeSql(again: boolean): string {
  const fencedInput = 'input i JOIN fenced f ON f.id = i.request_id AND f.attempt = i.attempt';
  const insert = (from: string) => `INSERT INTO sarsen.chunks (request_id, last_seq, attempt, frames, frame_lengths, bytes)
  SELECT request_id, last_seq, attempt, frames, lengths::int[], bytes FROM ${from}
  RETURNING request_id, attempt, last_seq, bytes`;
  const writes = again
    ? [
        {
          // Each row and whether its sequence number is stored already: NULL when not, true when
          // by these very frames (a flush repeated because its commit's answer was lost: they count
          // as stored, their bytes once), false when by others (refused).
          name: 'found',
          materialized: true,
          sql: `SELECT i.request_id, i.attempt, i.last_seq, i.frames, i.lengths, i.bytes,
          (SELECT k.attempt = i.attempt AND k.frames = i.frames FROM sarsen.chunks k
            WHERE k.request_id = i.request_id AND k.last_seq = i.last_seq AND ${notBelowIds('k.request_id', STORE_INPUT.array('request_id'))}) AS stored
     FROM ${fencedInput}`,
        },
        { name: 'inserted', sql: insert('found WHERE stored IS NULL') },
        {
          name: 'ins',
          sql: `SELECT * FROM inserted
  UNION ALL
  SELECT request_id, attempt, last_seq, 0 FROM found WHERE stored`,
        },
      ]
    : [{ name: 'ins', sql: insert(`(SELECT i.* FROM ${fencedInput}) AS i`) }];
  return withParts(
    [
      { name: 'input', sql: STORE_INPUT.rows },
      {
        name: 'fenced',
        // The fence: frames are stored only while their attempt holds the request (a flush may also
        // carry a discarded attempt's last frames: they are joined by attempt too, and left out).
        // The share lock keeps a recovery (which takes the row for update) from slipping in before
        // this commits.
        sql: `SELECT q.id, q.attempts AS attempt, q.namespace_id FROM sarsen.requests q
    JOIN (SELECT DISTINCT request_id, attempt FROM input) AS i ON q.id = i.request_id AND q.attempts = i.attempt
   WHERE ${oneOfIds('q.id', STORE_INPUT.array('request_id'))} AND q.status = 'running'
     FOR SHARE OF q`,
      },
      ...writes,
      { name: 'per_request', sql: `SELECT request_id, attempt, max(last_seq) AS seq, sum(bytes) AS bytes FROM ins GROUP BY request_id, attempt` },
      {
        name: 'stored',
        sql: `${addToRollup(
          ['chunk_bytes'],
          `SELECT f.namespace_id, sum(p.bytes) AS chunk_bytes FROM per_request p JOIN fenced f ON f.id = p.request_id AND f.attempt = p.attempt GROUP BY f.namespace_id`,
        )}
  RETURNING 1`,
      },
      { name: 'notified', sql: notifyEvents(`SELECT request_id, 'frames' AS event, seq AS arg FROM per_request`, STORE_INPUT.param('origin')) },
    ],
    `SELECT p.request_id, p.attempt, p.seq, (SELECT count(*) FROM notified) + (SELECT count(*) FROM stored) AS side_effects
  FROM per_request p`,
  );
}
const STORE_SQL = storeSql(false);
const STORE_AGAIN_SQL = storeSql(true);
const STORE = prepared('sarsen_store_frames', STORE_SQL);
const STORE_AGAIN = prepared('sarsen_store_frames_again', STORE_AGAIN_SQL);

/** The statements' text by name (test/sql-snapshots holds a copy of each). */
export const FRAME_SQL: Readonly<Record<string, string>> = { sarsen_store_frames: STORE_SQL, sarsen_store_frames_again: STORE_AGAIN_SQL };

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
  const values = STORE_INPUT.values(pack(frames), { origin });
  for (let again = 0; ; again++) {
    try {
      const { rows } = await pool.query<{ request_id: string; attempt: number; seq: number }>((again ? STORE_AGAIN : STORE)(values));
      return new Map(rows.map((r) => [r.request_id, { attempt: r.attempt, seq: r.seq }]));
    } catch (err) {
      // A sequence number is stored already (this flush repeated because its commit's answer was
      // lost, or its first try committed meanwhile): the statement stored nothing, and the one
      // that looks each row up first finds what is.
      if (!isUniqueViolation(err) || again >= 2) throw err;
    }
  }
}

export type StoredRow = { last_seq: number; attempt: number; frames: Bytes; frame_lengths: number[] | null; bytes: number | null };

/** The SQL of a stored row's columns (of `sarsen.chunks` as `c`), as StoredRow reads them through `storedRow`. */
export const STORED_ROW_COLUMNS = `c.last_seq, c.attempt, ${selectBytes('c.frames')} AS frames, c.frame_lengths, c.bytes`;
export const storedRow = <R extends { frames: string }>(r: R): Omit<R, 'frames'> & { frames: Bytes } => ({ ...r, frames: bytesFrom(r.frames)! });

const latin1 = (b: Bytes): string => (typeof b === 'string' ? b : b.toString('latin1'));

/**
 * The frames of stored rows (in order) after `afterSeq`, each with its sequence number. A
 * difference is decoded from the frame before it: the rows' own, or `before` (the frame at
 * `afterSeq`, when the caller has it). Frames up to `afterSeq` are read only as references, and
 * one whose reference is not there is skipped; the rows must then start at a whole frame
 * (keyframeAtOrBefore). Rows written before migration 034 hold their frames whole: they come
 * as slices of the row, no copies.
 */
function unpack(rows: readonly StoredRow[], afterSeq: number, before: ChunkRow | null): ChunkRow[] {
  const out: ChunkRow[] = [];
  let ref = before;
  for (const row of rows) {
    const lengths = row.frame_lengths ?? [row.frames.length];
    const { frames, attempt } = row;
    let at = 0;
    let seq = row.last_seq - lengths.length + 1;
    for (const length of lengths) {
      const stored = typeof frames === 'string' ? frames.slice(at, at + length) : frames.subarray(at, at + length);
      at += length;
      if (seq <= afterSeq && before !== null && before.seq === seq && before.attempt === attempt) ref = before;
      else if (row.bytes === null) ref = { seq, attempt, frame: stored };
      else {
        const frame = decodeFrame(latin1(stored), ref !== null && ref.seq === seq - 1 && ref.attempt === attempt ? latin1(ref.frame) : null);
        if (frame === null && seq > afterSeq) throw new Error(`frame ${seq} of attempt ${attempt} is stored as a difference from a frame not read`);
        ref = frame === null ? null : { seq, attempt, frame };
      }
      if (seq > afterSeq) out.push(ref!);
      seq++;
    }
  }
  return out;
}

const READ = prepared(
  'sarsen_read_frames',
  `SELECT ${STORED_ROW_COLUMNS} FROM (
     SELECT last_seq, attempt, frames, frame_lengths, bytes FROM sarsen.chunks WHERE request_id = $1 AND last_seq > $5 AND last_seq <= $2
     UNION ALL
     SELECT last_seq, attempt, frames, frame_lengths, bytes FROM (
       SELECT last_seq, attempt, frames, frame_lengths, bytes,
              sum(coalesce(bytes, octet_length(frames))) OVER (ORDER BY last_seq) - coalesce(bytes, octet_length(frames)) AS bytes_before
         FROM sarsen.chunks WHERE request_id = $1 AND last_seq > $2 ORDER BY last_seq LIMIT $3
     ) AS page
     WHERE bytes_before < $4
   ) AS c
   ORDER BY last_seq`,
);

/**
 * Stored frames after `afterSeq`, in order: a page of at most `rows` stored rows and about
 * `maxBytes` of frames (at least one row), so a reader holds a page of a stream, never all of it.
 * `more` says the page was cut (there may be more). `before`: the frame at `afterSeq`, which a
 * reader following the stream has; without it the read starts at the whole frame before
 * (at most KEYFRAME_EVERY - 1 frames more). Frames come as text where they can (see Bytes), so
 * that writing a page to a socket makes no Buffer of it.
 */
export async function readFrames(
  pool: Pool,
  requestId: string,
  afterSeq: number,
  page: { rows: number; maxBytes: number },
  before: ChunkRow | null = null,
): Promise<{ frames: ChunkRow[]; more: boolean }> {
  const from = before !== null && before.seq === afterSeq ? afterSeq : keyframeAtOrBefore(afterSeq + 1) - 1;
  const { rows } = await pool.query<Omit<StoredRow, 'frames'> & { frames: string }>(READ([requestId, afterSeq, page.rows, page.maxBytes, from]));
  const stored = rows.map(storedRow);
  // The frames are the page's only holders from here on. pg's result is made when the query is
  // sent and gets its rows when they arrive; one that outlived the young generation meanwhile (a
  // busy process: fifty readers on eight connections) kept them, the page's text, through every
  // young collection until the next full one, and so did whatever holds the result. Emptied, it
  // holds nothing of the page (docs/measurements.md "Memory").
  rows.length = 0;
  let pageRows = 0;
  let bytes = 0;
  for (const r of stored) {
    if (r.last_seq <= afterSeq) continue;
    pageRows++;
    bytes += r.bytes ?? r.frames.length;
  }
  return { frames: unpack(stored, afterSeq, before), more: pageRows === page.rows || bytes >= page.maxBytes };
}

/**
 * The frames of a request's last stored row, decoded (a succeeded stream's last row holds its
 * final event): read with the rows back to the whole frame it starts from.
 */
export async function readLastFrames(pool: Pool, requestId: string): Promise<ChunkRow[]> {
  const { rows } = await pool.query<Omit<StoredRow, 'frames'> & { frames: string }>(
    `WITH last AS (SELECT last_seq - coalesce(cardinality(frame_lengths), 1) AS before FROM sarsen.chunks WHERE request_id = $1 ORDER BY last_seq DESC LIMIT 1)
     SELECT ${STORED_ROW_COLUMNS} FROM sarsen.chunks c, last
      WHERE c.request_id = $1 AND c.last_seq > last.before - (last.before + 1) % ${KEYFRAME_EVERY}
      ORDER BY c.last_seq`,
    [requestId],
  );
  const last = rows.at(-1);
  if (!last) return [];
  const before = last.last_seq - (last.frame_lengths?.length ?? 1);
  return unpack(rows.map(storedRow), before, null);
}

/**
 * A request's frames from its stored rows, handed over in order (export reads them a page at a
 * time): each row's frames, decoded with the frame before them at hand.
 */
export function createFrameReader(): (row: StoredRow) => ChunkRow[] {
  let last: ChunkRow | null = null;
  return (row) => {
    const afterSeq = row.last_seq - (row.frame_lengths?.length ?? 1);
    const frames = unpack([row], afterSeq, last !== null && last.seq === afterSeq ? last : null);
    last = frames.at(-1) ?? last;
    return frames;
  };
}
export type FrameReader = ReturnType<typeof createFrameReader>;

/** A frame's bytes as a Buffer (a frame read as text is latin1: a character a byte). */
export const frameBytes = (row: ChunkRow): Buffer => (typeof row.frame === 'string' ? Buffer.from(row.frame, 'latin1') : row.frame);

/** Whether frame `seq` of the request is still stored (frames of a discarded attempt are not). */
export async function frameExists(pool: Pool, requestId: string, seq: number): Promise<boolean> {
  const { rowCount } = await pool.query(
    `SELECT 1 FROM (SELECT last_seq, frame_lengths FROM sarsen.chunks WHERE request_id = $1 AND last_seq >= $2 ORDER BY last_seq LIMIT 1) AS c
      WHERE c.last_seq - coalesce(cardinality(c.frame_lengths), 1) < $2`,
    [requestId, seq],
  );
  return rowCount === 1;
}
