// Stream frames (docs/durability.md "Stream frames"), stored packed (migration 007): one row
// per chunk-writer flush and attempt, holding that flush's frames of the attempt back to back.
// Writers hand over single frames and readers get single frames; the packing lives here.
import type { Pool } from './pool.ts';
import { prepared } from './pool.ts';
import type { ChunkRow } from './requests.ts';
import { addToRollup } from './counters.ts';
import { notifyEvents } from './events.ts';
import { isUniqueViolation } from './pg-errors.ts';
import { batchInput, bytesFrom, notBelowIds, oneOfIds, selectBytes, withParts, type Bytes } from './columns.ts';

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

const STORE_INPUT = batchInput<Packed, { origin: string }>(
  [
    ['request_id', 'text', (p) => p.requestId],
    ['attempt', 'int', (p) => p.attempt],
    ['last_seq', 'int', (p) => p.lastSeq],
    ['frames', 'binary', (p) => (p.frames.length === 1 ? p.frames[0]! : Buffer.concat(p.frames))],
    // Each frame's length, as an int[] literal; NULL for a row of one frame.
    ['lengths', 'text', (p) => (p.frames.length === 1 ? null : `{${p.frames.map((f) => f.length).join(',')}}`)],
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
  const insert = (from: string) => `INSERT INTO sarsen.chunks (request_id, last_seq, attempt, frames, frame_lengths)
  SELECT request_id, last_seq, attempt, frames, lengths::int[] FROM ${from}
  RETURNING request_id, attempt, last_seq, octet_length(frames) AS bytes`;
  const writes = again
    ? [
        {
          // Each row and whether its sequence number is stored already: NULL when not, true when
          // by these very frames (a flush repeated because its commit's answer was lost: they count
          // as stored, their bytes once), false when by others (refused).
          name: 'found',
          materialized: true,
          sql: `SELECT i.request_id, i.attempt, i.last_seq, i.frames, i.lengths,
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

type StoredRow = { last_seq: number; attempt: number; frames: Bytes; frame_lengths: number[] | null };

/** The frames of a stored row after `afterSeq`, each with its sequence number (slices of the row: no copies). */
function unpack(row: StoredRow, afterSeq: number, out: ChunkRow[]): void {
  const lengths = row.frame_lengths ?? [row.frames.length];
  let at = 0;
  let seq = row.last_seq - lengths.length + 1;
  const { frames } = row;
  for (const length of lengths) {
    if (seq > afterSeq) out.push({ seq, attempt: row.attempt, frame: typeof frames === 'string' ? frames.slice(at, at + length) : frames.subarray(at, at + length) });
    seq++;
    at += length;
  }
}

const READ = prepared(
  'sarsen_read_frames',
  `SELECT last_seq, attempt, ${selectBytes('frames')} AS frames, frame_lengths FROM (
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
 * says the page was cut (there may be more). Frames come as text where they can (see Bytes),
 * so that writing a page to a socket makes no Buffer of it.
 */
export async function readFrames(
  pool: Pool,
  requestId: string,
  afterSeq: number,
  page: { rows: number; maxBytes: number },
): Promise<{ frames: ChunkRow[]; more: boolean }> {
  const { rows } = await pool.query<Omit<StoredRow, 'frames'> & { frames: string }>(READ([requestId, afterSeq, page.rows, page.maxBytes]));
  const frames: ChunkRow[] = [];
  let bytes = 0;
  for (const r of rows) {
    const row = { ...r, frames: bytesFrom(r.frames)! };
    unpack(row, afterSeq, frames);
    bytes += row.frames.length;
  }
  const more = rows.length === page.rows || bytes >= page.maxBytes;
  // The frames are the page's only holders from here on. pg's result is made when the query is
  // sent and gets its rows when they arrive; one that outlived the young generation meanwhile (a
  // busy process: fifty readers on eight connections) kept them, the page's text, through every
  // young collection until the next full one, and so did whatever holds the result. Emptied, it
  // holds nothing of the page (docs/measurements.md "Memory").
  rows.length = 0;
  return { frames, more };
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
