// The SQL of batches (docs/api.md "Batches"), in a line's order: a batch and its lines as
// validation writes them; the dispatcher's statements (a bounded number of lines in flight
// across the deployment, handed to the queue as ordinary requests); the batch's end, its lines'
// results and its files' sizes; then the views, cancel and delete. A line that became a request
// keeps no copy of how it went: its state and its result are read from its request, the only
// record of it (and its stored answer, never copied).
import type { Pool, PoolClient } from './pool.ts';
import type { Dialect } from './requests.ts';
import type { BatchState, Counts, EndedLine, LineState } from '../core/batch-shapes.ts';
import type { CheckedLine, LineRefusal } from '../core/batch-lines.ts';

type Db = Pick<Pool, 'query'>;

export type Vendor = 'openai' | 'anthropic';

/** A batch as stored: what its vendor shape is made of (src/core/batch-shapes.ts), and whose it is. */
export type BatchRow = Omit<BatchState, 'counts'> & { vendor: Vendor; namespace_id: string; api_key_id: string; dialect: Dialect };

export type { LineState };
export type LineCounts = Counts;
export type BatchView = BatchRow & { counts: LineCounts };

export type NewBatch = {
  id: string;
  vendor: Vendor;
  tenancyId: string;
  namespaceId: string;
  apiKeyId: string;
  dialect: Dialect;
  endpoint: string;
  inputFileId: string | null;
  completionWindow: string;
  windowMs: number;
  metadata: Record<string, string> | null;
};

// ---------- upload: a batch and its lines as validation leaves them ----------

export async function insertBatch(c: Db, b: NewBatch, errors: BatchRow['errors'] = null): Promise<void> {
  await c.query(
    `INSERT INTO sarsen.batches (id, vendor, tenancy_id, namespace_id, api_key_id, dialect, endpoint, input_file_id, completion_window, metadata, errors, expires_at, ended_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, now() + make_interval(secs => $12::float8 / 1000), CASE WHEN $11::jsonb IS NOT NULL THEN now() END)`,
    [b.id, b.vendor, b.tenancyId, b.namespaceId, b.apiKeyId, b.dialect, b.endpoint, b.inputFileId, b.completionWindow,
      b.metadata === null ? null : JSON.stringify(b.metadata), errors === null ? null : JSON.stringify(errors), b.windowMs],
  );
}

/** Writes a run of a batch's lines (one statement, one array per column): waiting with its body, or refused already. */
export async function insertLines(c: Db, batchId: string, lines: readonly CheckedLine[]): Promise<void> {
  if (lines.length === 0) return;
  await c.query(
    `INSERT INTO sarsen.batch_lines (batch_id, line, custom_id, state, model, body, error_code, error_status, error_message)
     SELECT $1, l.line, l.custom_id, CASE WHEN l.code IS NULL THEN 'waiting' ELSE 'refused' END, l.model, l.body, l.code, l.status, l.message
       FROM unnest($2::int[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[], $8::text[]) AS l(line, custom_id, model, body, code, status, message)`,
    [batchId, lines.map((l) => l.line), lines.map((l) => l.customId), lines.map((l) => l.model), lines.map((l) => l.body),
      lines.map((l) => l.refusal?.code ?? null), lines.map((l) => l.refusal?.status ?? null), lines.map((l) => l.refusal?.message ?? null)],
  );
}

export async function setBatchTotal(c: Db, batchId: string, total: number): Promise<void> {
  await c.query(`UPDATE sarsen.batches SET total = $2 WHERE id = $1`, [batchId, total]);
}

/** Lines of a batch that repeat an earlier line's custom_id (validation names them). */
export async function duplicateCustomIds(c: Db, batchId: string, limit: number): Promise<{ custom_id: string; line: number; first: number }[]> {
  const { rows } = await c.query<{ custom_id: string; line: number; first: number }>(
    `SELECT custom_id, line, first FROM (
       SELECT custom_id, line, min(line) OVER (PARTITION BY custom_id) AS first FROM sarsen.batch_lines WHERE batch_id = $1
     ) l WHERE line <> first ORDER BY line LIMIT $2`,
    [batchId, limit],
  );
  return rows;
}

// ---------- a line's state, read from its request ----------

// A line's own state is `waiting`, `refused`, `canceled` or `expired` until it becomes a request,
// then `dispatched` for good. As read (`l` a line, `q` its request, LEFT JOINed): a dispatched
// line is running until its request ends, then ends as it did; one whose request row is gone
// (past the listing horizon, which outlives any batch) reads as failed.
const LINE_STATE = `CASE WHEN l.state <> 'dispatched' THEN l.state
  WHEN q.status IN ('pending', 'running') THEN 'running'
  WHEN q.status = 'succeeded' THEN 'succeeded' ELSE 'failed' END`;
// Whether a dispatched line's answer is still stored (retention has not swept it).
const ANSWER_STORED = `coalesce(NOT q.expired AND EXISTS (SELECT 1 FROM sarsen.responses a WHERE a.request_id = l.request_id), false)`;
// The lines whose request has not ended: read from the live requests (through their partial
// indexes: pending, and leased while running), never from every line a batch dispatched.
const LIVE_LINES = `SELECT l.batch_id FROM (
    SELECT id FROM sarsen.requests WHERE status = 'pending'
    UNION ALL SELECT id FROM sarsen.requests WHERE lease_expires_at IS NOT NULL AND status = 'running'
  ) live JOIN sarsen.batch_lines l ON l.request_id = live.id AND l.state = 'dispatched'`;

// ---------- the dispatcher (src/executor/batch-dispatch.ts) ----------

/** Whether any batch has not ended: what the dispatcher asks when woken (a new batch's NOTIFY, a reconnect) or at its slow backstop pace. */
export async function anyActiveBatch(db: Db): Promise<boolean> {
  const { rows } = await db.query<{ active: boolean }>({ name: 'any_active_batch', text: `SELECT EXISTS (SELECT 1 FROM sarsen.batches WHERE ended_at IS NULL) AS active` });
  return rows[0]!.active;
}

// One dispatcher at a time across the deployment, for the length of its transaction.
const DISPATCH_LOCK = 0x5a5_ba7c;

export async function tryDispatchLock(c: PoolClient): Promise<boolean> {
  const { rows } = await c.query<{ locked: boolean }>(`SELECT pg_try_advisory_xact_lock($1) AS locked`, [DISPATCH_LOCK]);
  return rows[0]!.locked;
}

/**
 * Lines of batches past their window that never ran expire. Answers how many did, and how many
 * lines are in flight (their request has not ended).
 */
export async function expireLines(c: PoolClient): Promise<{ expired: number; inFlight: number }> {
  const { rows } = await c.query<{ expired: number; in_flight: number }>(
    `WITH expired AS (
       UPDATE sarsen.batch_lines SET state = 'expired', body = NULL
        WHERE state = 'waiting' AND batch_id IN (SELECT id FROM sarsen.batches WHERE ended_at IS NULL AND expires_at <= now())
       RETURNING batch_id
     ), lapsed AS (
       -- Expired: a batch the window ended with lines unrun (one whose every line had started is not).
       UPDATE sarsen.batches SET expired_at = now() WHERE id IN (SELECT batch_id FROM expired) AND expired_at IS NULL RETURNING id
     )
     SELECT (SELECT count(*) FROM expired)::int AS expired, (SELECT count(*) FROM (${LIVE_LINES}) f)::int AS in_flight,
            (SELECT count(*) FROM lapsed) AS lapsed`,
  );
  const r = rows[0]!;
  return { expired: r.expired, inFlight: r.in_flight };
}

export type WaitingLine = {
  batch_id: string;
  line: number;
  model: string;
  body: string;
  tenancy_id: string;
  namespace_id: string;
  api_key_id: string;
  dialect: Dialect;
  requests_per_minute: number | null;
  tokens_per_minute: number | null;
  /** The batch's key was revoked (or removed) since the batch was accepted. */
  key_revoked: boolean;
};

/** Up to `n` waiting lines of running batches, oldest batch first, locked for this transaction. */
export async function pickWaitingLines(c: PoolClient, n: number): Promise<WaitingLine[]> {
  const { rows } = await c.query<WaitingLine>(
    // Each running batch's first waiting lines through the partial index (never a sort of a
    // whole batch), oldest batch first.
    `SELECT l.batch_id, l.line, l.model, l.body, b.tenancy_id, b.namespace_id, b.api_key_id, b.dialect,
            k.requests_per_minute, k.tokens_per_minute::float8 AS tokens_per_minute, (k.id IS NULL OR k.revoked_at IS NOT NULL) AS key_revoked
       FROM (SELECT id, tenancy_id, namespace_id, api_key_id, dialect FROM sarsen.batches
              WHERE ended_at IS NULL AND cancelling_at IS NULL AND expires_at > now() AND (paused_until IS NULL OR paused_until <= now())
              ORDER BY id LIMIT 16) b
       CROSS JOIN LATERAL (
         SELECT w.batch_id, w.line, w.model, w.body FROM sarsen.batch_lines w
          WHERE w.batch_id = b.id AND w.state = 'waiting' ORDER BY w.line LIMIT $1
          FOR UPDATE SKIP LOCKED
       ) l
       LEFT JOIN sarsen.api_keys k ON k.id = b.api_key_id
      ORDER BY b.id, l.line
      LIMIT $1`,
    [n],
  );
  return rows;
}

export type LineOutcome =
  | { batchId: string; line: number; requestId: string }
  | { batchId: string; line: number; refusal: LineRefusal };

/** Lines handed to the queue (their body is now the request's) or refused as Sarsen would have answered. */
export async function markLines(c: PoolClient, outcomes: readonly LineOutcome[]): Promise<void> {
  if (outcomes.length === 0) return;
  const get = <T>(f: (o: LineOutcome) => T) => outcomes.map(f);
  await c.query(
    `UPDATE sarsen.batch_lines l
        SET state = CASE WHEN o.request_id IS NULL THEN 'refused' ELSE 'dispatched' END, body = NULL,
            request_id = o.request_id, error_code = o.code, error_status = o.status, error_message = o.message
       FROM unnest($1::text[], $2::int[], $3::text[], $4::text[], $5::int[], $6::text[]) AS o(batch_id, line, request_id, code, status, message)
      WHERE l.batch_id = o.batch_id AND l.line = o.line`,
    [get((o) => o.batchId), get((o) => o.line), get((o) => ('requestId' in o ? o.requestId : null)),
      get((o) => ('refusal' in o ? o.refusal.code : null)), get((o) => ('refusal' in o ? o.refusal.status : null)), get((o) => ('refusal' in o ? o.refusal.message : null))],
  );
}

/** A key over its rate limit: its batch waits this long before its next line. */
export async function pauseBatch(c: PoolClient, batchId: string, seconds: number): Promise<void> {
  await c.query(`UPDATE sarsen.batches SET paused_until = now() + make_interval(secs => $2) WHERE id = $1`, [batchId, seconds]);
}

/** Runs `fn` under a savepoint of the caller's transaction: a throw undoes only what `fn` wrote. */
export async function withSavepoint<T>(c: PoolClient, fn: () => Promise<T>): Promise<T> {
  await c.query('SAVEPOINT batch_line');
  try {
    const out = await fn();
    await c.query('RELEASE SAVEPOINT batch_line');
    return out;
  } catch (err) {
    await c.query('ROLLBACK TO SAVEPOINT batch_line');
    throw err;
  }
}

// ---------- the end: results and files ----------

/** Batches whose every line ended: marked finalizing (once); answers every batch now finalizing. */
export async function finalizingBatches(c: Db): Promise<{ id: string; vendor: Vendor; tenancy_id: string; namespace_id: string }[]> {
  const { rows } = await c.query<{ id: string; vendor: Vendor; tenancy_id: string; namespace_id: string }>(
    `WITH live AS (${LIVE_LINES}), done AS (
       UPDATE sarsen.batches b SET finalizing_at = now()
        WHERE b.ended_at IS NULL AND b.finalizing_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM sarsen.batch_lines l WHERE l.batch_id = b.id AND l.state = 'waiting')
          AND b.id NOT IN (SELECT batch_id FROM live)
       RETURNING id
     )
     SELECT id, vendor, tenancy_id, namespace_id FROM sarsen.batches WHERE ended_at IS NULL AND (finalizing_at IS NOT NULL OR id IN (SELECT id FROM done))`,
  );
  return rows;
}

/** A page of a batch's ended lines in line order, each with its request's stored answer. */
export async function resultPage(db: Db, batchId: string, afterLine: number, limit: number): Promise<EndedLine[]> {
  const { rows } = await db.query<EndedLine>(
    `SELECT * FROM (
       SELECT l.line, l.custom_id, ${LINE_STATE} AS state, l.request_id, l.error_code, l.error_status, l.error_message,
              r.status AS answer_status, r.body AS answer, (l.request_id IS NOT NULL AND NOT ${ANSWER_STORED}) AS swept
         FROM sarsen.batch_lines l
         LEFT JOIN sarsen.requests q ON q.id = l.request_id
         LEFT JOIN sarsen.responses r ON r.request_id = l.request_id
        WHERE l.batch_id = $1 AND l.line > $2 AND l.state <> 'waiting'
     ) l WHERE state <> 'running' ORDER BY line LIMIT $3`,
    [batchId, afterLine, limit],
  );
  return rows;
}

/** Every ended line of a batch, a page at a time (what its results and files are built from). */
export async function* resultPages(db: Db, batchId: string, pageSize = 500): AsyncGenerator<EndedLine[]> {
  for (let after = 0; ; ) {
    const page = await resultPage(db, batchId, after, pageSize);
    if (page.length > 0) yield page;
    if (page.length < pageSize) return;
    after = page.at(-1)!.line;
  }
}

/** Records a page of lines' sizes in their OpenAI file, as written now and once swept (src/core/batch-shapes.ts openaiLineBytes). */
export async function setLineBytes(c: Db, batchId: string, sizes: readonly { line: number; result: number; swept: number }[]): Promise<void> {
  if (sizes.length === 0) return;
  await c.query(
    `UPDATE sarsen.batch_lines l SET result_bytes = s.result, swept_bytes = s.swept
       FROM unnest($2::int[], $3::int[], $4::int[]) AS s(line, result, swept)
      WHERE l.batch_id = $1 AND l.line = s.line`,
    [batchId, sizes.map((s) => s.line), sizes.map((s) => s.result), sizes.map((s) => s.swept)],
  );
}

/** Ends a finalizing batch; its output and error files (OpenAI) get rows, their content and size are read from its lines. */
export async function endBatch(
  db: Pool,
  b: { id: string; tenancyId: string; namespaceId: string },
  files: { output: string | null; error: string | null },
): Promise<void> {
  await db.query(
    `WITH ended AS (
       UPDATE sarsen.batches SET ended_at = now(), output_file_id = $4, error_file_id = $5 WHERE id = $1 AND ended_at IS NULL RETURNING id
     )
     INSERT INTO sarsen.files (id, tenancy_id, namespace_id, purpose, filename, bytes, batch_id, kind)
     SELECT f.id, $2, $3, 'batch_output', f.name, NULL, $1, f.kind
       FROM (VALUES ($4::text, 'output', 'batch_' || $1 || '_output.jsonl'), ($5::text, 'error', 'batch_' || $1 || '_error.jsonl')) AS f(id, kind, name)
      WHERE f.id IS NOT NULL AND EXISTS (SELECT 1 FROM ended)`,
    [b.id, b.tenancyId, b.namespaceId, files.output, files.error],
  );
}

/**
 * SQL: the bytes of the batch output or error file `f` (a row of sarsen.files) as it is now, the
 * sum of its lines' recorded sizes, each as written with its answer or, once swept, without.
 */
export const batchFileBytesSql = (f: string) => `(
  SELECT coalesce(sum(CASE WHEN l.request_id IS NOT NULL AND NOT ${ANSWER_STORED} THEN l.swept_bytes ELSE l.result_bytes END), 0)
    FROM sarsen.batch_lines l LEFT JOIN sarsen.requests q ON q.id = l.request_id
   WHERE l.batch_id = ${f}.batch_id AND l.state <> 'waiting' AND (${LINE_STATE} = 'succeeded') = (${f}.kind = 'output'))`;

// ---------- views, cancel and delete ----------

const BATCH_COLUMNS = `b.id, b.vendor, b.namespace_id, b.api_key_id, b.dialect, b.endpoint, b.input_file_id, b.completion_window, b.metadata, b.errors, b.total,
  b.created_at, b.expires_at, b.cancelling_at, b.expired_at, b.finalizing_at, b.ended_at, b.output_file_id, b.error_file_id`;
// The lines' counts by state as read.
const COUNTS = `(SELECT coalesce(json_object_agg(state, n), '{}') FROM (
    SELECT ${LINE_STATE} AS state, count(*)::int AS n FROM sarsen.batch_lines l LEFT JOIN sarsen.requests q ON q.id = l.request_id
     WHERE l.batch_id = b.id GROUP BY 1) s) AS counts`;

const withCounts = (row: BatchRow & { counts: Partial<LineCounts> }): BatchView => ({
  ...row,
  counts: { waiting: 0, running: 0, succeeded: 0, failed: 0, refused: 0, canceled: 0, expired: 0, ...row.counts },
});

export async function findBatch(db: Db, namespaceId: string, id: string, vendor: Vendor): Promise<BatchView | null> {
  const { rows } = await db.query<BatchRow & { counts: Partial<LineCounts> }>(
    `SELECT ${BATCH_COLUMNS}, ${COUNTS} FROM sarsen.batches b WHERE b.id = $1 AND b.namespace_id = $2 AND b.vendor = $3`,
    [id, namespaceId, vendor],
  );
  return rows[0] ? withCounts(rows[0]) : null;
}

/** A page of a namespace's batches of one vendor, newest first: after `after` (older), or before `before` (newer). */
export async function listBatches(
  db: Db,
  namespaceId: string | null,
  vendor: Vendor | null,
  opts: { after: string | null; before: string | null; limit: number; id?: string },
): Promise<BatchView[]> {
  const { rows } = await db.query<BatchRow & { counts: Partial<LineCounts> }>(
    `SELECT * FROM (
       SELECT ${BATCH_COLUMNS}, ${COUNTS} FROM sarsen.batches b
        WHERE ($1::text IS NULL OR b.namespace_id = $1) AND ($2::text IS NULL OR b.vendor = $2)
          AND ($3::text IS NULL OR b.id < $3) AND ($4::text IS NULL OR b.id > $4) AND ($6::text IS NULL OR b.id = $6)
        ORDER BY CASE WHEN $4::text IS NULL THEN b.id END DESC, b.id ASC LIMIT $5
     ) page ORDER BY id DESC`,
    [namespaceId, vendor, opts.after, opts.before, opts.limit, opts.id ?? null],
  );
  return rows.map(withCounts);
}

export type LineRow = Pick<EndedLine, 'line' | 'custom_id' | 'state' | 'request_id' | 'error_code' | 'error_status'>;

/** A page of a batch's lines in order, without bodies (the console). */
export async function listLines(db: Db, batchId: string, afterLine: number, limit: number): Promise<LineRow[]> {
  const { rows } = await db.query<LineRow>(
    `SELECT l.line, l.custom_id, ${LINE_STATE} AS state, l.request_id, l.error_code, l.error_status
       FROM sarsen.batch_lines l LEFT JOIN sarsen.requests q ON q.id = l.request_id
      WHERE l.batch_id = $1 AND l.line > $2 ORDER BY l.line LIMIT $3`,
    [batchId, afterLine, limit],
  );
  return rows;
}

/** Cancel: lines not yet dispatched end `canceled` at once; those in flight end on their own. False: no such batch. */
export async function cancelBatch(db: Pool, namespaceId: string, id: string, vendor: Vendor): Promise<boolean> {
  const { rows } = await db.query<{ n: number }>(
    `WITH b AS (
       UPDATE sarsen.batches SET cancelling_at = coalesce(cancelling_at, now())
        WHERE id = $1 AND namespace_id = $2 AND vendor = $3 AND ended_at IS NULL RETURNING id
     ), lines AS (
       UPDATE sarsen.batch_lines SET state = 'canceled', body = NULL WHERE batch_id IN (SELECT id FROM b) AND state = 'waiting' RETURNING 1
     )
     SELECT (SELECT count(*) FROM b)::int AS n, (SELECT count(*) FROM lines) AS l`,
    [id, namespaceId, vendor],
  );
  return rows[0]!.n === 1;
}

/** Deletes an ended batch and its lines (Anthropic's DELETE); the requests stay, under their retention. */
export async function deleteBatch(db: Db, namespaceId: string, id: string): Promise<boolean> {
  const { rows } = await db.query<{ n: number }>(
    `WITH b AS (DELETE FROM sarsen.batches WHERE id = $1 AND namespace_id = $2 AND ended_at IS NOT NULL RETURNING id),
          lines AS (DELETE FROM sarsen.batch_lines WHERE batch_id IN (SELECT id FROM b) RETURNING 1)
     SELECT (SELECT count(*) FROM b)::int AS n, (SELECT count(*) FROM lines) AS l`,
    [id, namespaceId],
  );
  return rows[0]!.n === 1;
}
