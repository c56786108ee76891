// What the routes of the vendors' own APIs share (docs/api.md "Background responses", "Batches"):
// errors in the vendor's shape, so its SDK raises its own classes; JSON answers; the query
// parameters of their lists; and the acceptance of a batch, whichever vendor's. The shapes
// themselves are src/core/vendor-api.ts.
import type { Request, Response, RequestHandler } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { openaiErrorBody, parseLimit, parseId, parseOrder, parseCount } from '../../core/vendor-api.ts';
import { isLineError, type CheckedLine, type LineError } from '../../core/batch-lines.ts';
import { withTransaction } from '../../db/pool.ts';
import { insertBatch, insertLines, setBatchTotal, duplicateCustomIds, findBatch, type NewBatch, type BatchView, type Vendor } from '../../db/batches.ts';
import { serviceAuthOf } from '../service-auth.ts';
import { answerErrorsAs, sendError, type ErrorShape } from '../app.ts';

/**
 * A route whose errors answer in a vendor's error shape (docs/api.md "Errors"), so its SDK
 * raises its own classes: those the handler raises, and those the application's error handler
 * translates (an outage's 503, text PostgreSQL cannot store, an internal fault).
 */
export function vendorRoute(deps: Deps, handler: (deps: Deps, req: Request, res: Response) => Promise<void>, shape: ErrorShape = openaiErrorBody): RequestHandler {
  return async (req, res, next) => {
    answerErrorsAs(res, shape);
    try {
      await handler(deps, req, res);
    } catch (err) {
      if (!(err instanceof ServiceError) || res.headersSent) return next(err);
      if (err.retryAfterSeconds !== undefined) res.set('retry-after', String(err.retryAfterSeconds));
      // A refused upload is answered before its body was read: the connection cannot be reused.
      if (!req.complete) res.set('connection', 'close');
      sendError(res, err.code, err.status, err.message);
    }
  };
}

/** 200 with a JSON body: a value, or JSON text already made (a stored Response, byte for byte). */
export function sendJson(res: Response, body: unknown): void {
  res.status(200).set('content-type', 'application/json').send(typeof body === 'string' ? body : JSON.stringify(body));
}

/** The `limit` of a vendor's list, from 1 to `max`. */
export const limitParam = (req: Request, fallback: number, max: number): number => parseLimit(req.query.limit, fallback, max);

/** An id query parameter of a vendor's list, or null. */
export const idParam = (req: Request, name: string): string | null => parseId(req.query[name], name);

/** The `order` of a vendor's list: `asc` or `desc` (the default). */
export const orderParam = (req: Request): 'asc' | 'desc' => parseOrder(req.query.order);

/** A non-negative integer query parameter (a position), or null. */
export const countParam = (req: Request, name: string): number | null => parseCount(req.query[name], name);

// The vendors name at most this many lines of a refused input in its errors.
const MAX_ERRORS = 100;
// Lines are written this many at a time.
const RUN = 500;

class Invalid extends Error {
  readonly errors: LineError[];
  constructor(errors: LineError[]) {
    super('invalid batch input');
    this.errors = errors;
  }
}

/**
 * Accepts a batch of either vendor: writes it and its lines in one transaction, the lines in runs
 * as they are read, so a 50,000-line input is accepted in constant memory. Answers null, or the
 * validation errors of an input that broke the format: the batch is then recorded `failed`,
 * with no lines. The lines wait for the dispatcher (src/executor/batch-dispatch.ts), which hands
 * them to the queue as ordinary requests a bounded number at a time.
 */
export async function acceptBatch(deps: Deps, b: NewBatch, lines: AsyncIterable<CheckedLine | LineError>): Promise<LineError[] | null> {
  const maxLines = deps.settings.current().batch_max_lines;
  try {
    await withTransaction(deps.pool, async (c) => {
      await insertBatch(c, b);
      const errors: LineError[] = [];
      let run: CheckedLine[] = [];
      let total = 0;
      for await (const line of lines) {
        if (isLineError(line)) {
          if (errors.length < MAX_ERRORS) errors.push(line);
          continue;
        }
        if (++total > maxLines) {
          errors.push({ code: 'too_many_lines', message: `The input has more than ${maxLines} lines, this deployment's batch_max_lines.`, line: line.line, param: null });
          break;
        }
        if (errors.length > 0) continue; // nothing more is written: the transaction rolls back
        run.push(line);
        if (run.length >= RUN) {
          await insertLines(c, b.id, run);
          run = [];
        }
      }
      if (errors.length === 0) {
        await insertLines(c, b.id, run);
        if (total === 0) errors.push({ code: 'empty_file', message: 'The input has no lines.', line: null, param: null });
        for (const d of await duplicateCustomIds(c, b.id, MAX_ERRORS)) {
          errors.push({ code: 'duplicate_custom_id', message: `Line ${d.line} repeats the custom_id of line ${d.first}.`, line: d.line, param: 'custom_id' });
        }
      }
      if (errors.length > 0) throw new Invalid(errors);
      await setBatchTotal(c, b.id, total);
    });
    return null;
  } catch (err) {
    if (!(err instanceof Invalid)) throw err;
    await insertBatch(deps.pool, b, err.errors);
    return err.errors;
  }
}

/** The caller's batch of that vendor; 404 otherwise. */
export async function foundBatch(deps: Deps, res: Response, id: string, vendor: Vendor): Promise<BatchView> {
  const batch = await findBatch(deps.pool, serviceAuthOf(res).namespaceId, id, vendor);
  if (!batch) throw new ServiceError('not_found', `No batch with id ${JSON.stringify(id.slice(0, 100))} in this namespace.`);
  return batch;
}
