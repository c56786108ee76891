// The SQL of batches (docs/api.md "Batches"): a batch and its lines, the dispatcher's statements
// (a bounded number of lines in flight across the deployment, handed to the queue as ordinary
// requests), cancel, expiry, and the pages results are built from: the lines joined with their
// requests' stored answers, never a copy of them.
import type { Pool, PoolClient } from './pool.ts';
import type { Dialect } from './requests.ts';
import type { BatchState, Counts, LineState } from '../core/batch-shapes.ts';

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

/** A line as validation leaves it: waiting with its canonical body, or refused already (too large, streaming). */
export type NewLine = {
  line: number;
  customId: string;
  model: string | null;
  body: string | null;
  refusal: { code: string; status: number; message: string } | null;
};

export async function insertBatch(c: Db, b: NewBatch, errors: BatchRow['errors'] = null): Promise<void> {
  await c.query(
    `INSERT INTO sarsen.batches (id, vendor, tenancy_id, namespace_id, api_key_id, dialect, endpoint, input_file_id, completion_window, metadata, errors, expires_at, ended_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, now() + make_interval(secs => $12::float8 / 1000), CASE WHEN $11::jsonb IS NOT NULL THEN now() END)`,
    [b.id, b.vendor, b.tenancyId, b.namespaceId, b.apiKeyId, b.dialect, b.endpoint, b.inputFileId, b.completionWindow,
      b.metadata === null ? null : JSON.stringify(b.metadata), errors === null ? null : JSON.stringify(errors), b.windowMs],
  );
}

/** Writes a run of a batch's lines (one statement, one array per column). */
export async function insertLines(c: Db, batchId: string, lines: readonly NewLine[]): Promise<void> {
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

const BATCH_COLUMNS = `b.id, b.vendor, b.namespace_id, b.api_key_id, b.dialect, b.endpoint, b.input_file_id, b.completion_window, b.metadata, b.errors, b.total,
  b.created_at, b.expires_at, b.cancelling_at, b.expired_at, b.finalizing_at, b.ended_at, b.output_file_id, b.error_file_id`;
// The lines' counts by state, from an index of the batch's lines.
const COUNTS = `(SELECT coalesce(json_object_agg(state, n), '{}') FROM (SELECT state, count(*)::int AS n FROM sarsen.batch_lines WHERE batch_id = b.id GROUP BY state) s) AS counts`;

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
 * Lines in flight whose request ended take its end; lines of batches past their window that
 * never ran expire. Answers how many lines remain in flight.
 */
export async function settleLines(c: PoolClient): Promise<{ settled: number; expired: number; inFlight: number }> {
  const { rows } = await c.query<{ settled: number; expired: number; in_flight: number }>(
    `WITH settled AS (
       UPDATE sarsen.batch_lines l SET state = q.status
         FROM sarsen.requests q
        WHERE l.state = 'running' AND q.id = l.request_id AND q.status IN ('succeeded', 'failed')
       RETURNING l.batch_id, l.line
     ), expired AS (
       UPDATE sarsen.batch_lines SET state = 'expired', body = NULL
        WHERE state = 'waiting' AND batch_id IN (SELECT id FROM sarsen.batches WHERE ended_at IS NULL AND expires_at <= now())
       RETURNING batch_id
     ), lapsed AS (
       -- Expired: a batch the window ended with lines unrun (one whose every line had started is not).
       UPDATE sarsen.batches SET expired_at = now() WHERE id IN (SELECT batch_id FROM expired) AND expired_at IS NULL RETURNING id
     )
     SELECT (SELECT count(*) FROM settled)::int AS settled, (SELECT count(*) FROM expired)::int AS expired,
            ((SELECT count(*) FROM sarsen.batch_lines WHERE state = 'running') - (SELECT count(*) FROM settled))::int AS in_flight,
            (SELECT count(*) FROM lapsed) AS lapsed`,
  );
  const r = rows[0]!;
  return { settled: r.settled, expired: r.expired, inFlight: r.in_flight };
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
  | { batchId: string; line: number; refusal: { code: string; status: number; message: string } };

/** Lines handed to the queue (their body is now the request's) or refused as Sarsen would have answered. */
export async function markLines(c: PoolClient, outcomes: readonly LineOutcome[]): Promise<void> {
  if (outcomes.length === 0) return;
  const get = <T>(f: (o: LineOutcome) => T) => outcomes.map(f);
  await c.query(
    `UPDATE sarsen.batch_lines l
        SET state = CASE WHEN o.request_id IS NULL THEN 'refused' ELSE 'running' END, body = NULL,
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

/** Batches whose every line ended: marked finalizing (once); answers every batch now finalizing. */
export async function finalizingBatches(c: Db): Promise<{ id: string; vendor: Vendor; tenancy_id: string; namespace_id: string }[]> {
  const { rows } = await c.query<{ id: string; vendor: Vendor; tenancy_id: string; namespace_id: string }>(
    `WITH done AS (
       UPDATE sarsen.batches b SET finalizing_at = now()
        WHERE b.ended_at IS NULL AND b.finalizing_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM sarsen.batch_lines l WHERE l.batch_id = b.id AND l.state IN ('waiting', 'running'))
       RETURNING id
     )
     SELECT id, vendor, tenancy_id, namespace_id FROM sarsen.batches WHERE ended_at IS NULL AND (finalizing_at IS NOT NULL OR id IN (SELECT id FROM done))`,
  );
  return rows;
}

/** Ends a finalizing batch; its output and error files (OpenAI) get rows, their content is read from the answers. */
export async function endBatch(
  db: Pool,
  b: { id: string; tenancyId: string; namespaceId: string },
  files: { output: { id: string; bytes: number } | null; error: { id: string; bytes: number } | null },
): Promise<void> {
  await db.query(
    `WITH ended AS (
       UPDATE sarsen.batches SET ended_at = now(), output_file_id = $4, error_file_id = $6 WHERE id = $1 AND ended_at IS NULL RETURNING id
     )
     INSERT INTO sarsen.files (id, tenancy_id, namespace_id, purpose, filename, bytes, batch_id, kind)
     SELECT f.id, $2, $3, 'batch_output', f.name, f.bytes, $1, f.kind
       FROM (VALUES ($4::text, $5::bigint, 'output', 'batch_' || $1 || '_output.jsonl'), ($6::text, $7::bigint, 'error', 'batch_' || $1 || '_error.jsonl')) AS f(id, bytes, kind, name)
      WHERE f.id IS NOT NULL AND EXISTS (SELECT 1 FROM ended)`,
    [b.id, b.tenancyId, b.namespaceId, files.output?.id ?? null, files.output?.bytes ?? 0, files.error?.id ?? null, files.error?.bytes ?? 0],
  );
}

export type ResultLine = {
  line: number;
  custom_id: string;
  state: LineState;
  request_id: string | null;
  error_code: string | null;
  error_status: number | null;
  error_message: string | null;
  /** The request's stored answer: its HTTP status and body, byte for byte; null when swept. */
  answer_status: number | null;
  answer: Buffer | null;
  swept: boolean;
};

/** A page of a batch's ended lines in line order, each with its request's stored answer. */
export async function resultPage(db: Db, batchId: string, afterLine: number, limit: number): Promise<ResultLine[]> {
  const { rows } = await db.query<ResultLine>(
    `SELECT l.line, l.custom_id, l.state, l.request_id, l.error_code, l.error_status, l.error_message,
            r.status AS answer_status, r.body AS answer, coalesce(q.expired, false) AS swept
       FROM sarsen.batch_lines l
       LEFT JOIN sarsen.requests q ON q.id = l.request_id
       LEFT JOIN sarsen.responses r ON r.request_id = l.request_id
      WHERE l.batch_id = $1 AND l.line > $2 AND l.state NOT IN ('waiting', 'running')
      ORDER BY l.line LIMIT $3`,
    [batchId, afterLine, limit],
  );
  return rows;
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

export type LineRow = { line: number; custom_id: string; state: LineState; request_id: string | null; error_code: string | null; error_status: number | null };

/** A page of a batch's lines in order, without bodies (the console). */
export async function listLines(db: Db, batchId: string, afterLine: number, limit: number): Promise<LineRow[]> {
  const { rows } = await db.query<LineRow>(
    `SELECT line, custom_id, state, request_id, error_code, error_status FROM sarsen.batch_lines WHERE batch_id = $1 AND line > $2 ORDER BY line LIMIT $3`,
    [batchId, afterLine, limit],
  );
  return rows;
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
