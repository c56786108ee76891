// OpenAI's Batches API (docs/api.md "Batches"), and the acceptance both vendors' batches share:
// the input is read line by line (a file's pieces, streamed) and its lines written in runs of
// 500 inside one transaction, so a 50,000-line input is accepted in constant memory. An input
// that breaks the format fails as a whole with the vendor's `errors` naming the lines; the
// lines of a valid one wait for the dispatcher (src/executor/batch-dispatch.ts), which hands
// them to the queue as ordinary requests a bounded number at a time.
import type { Request, Response, Router, RequestHandler } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { openaiBatch } from '../../core/batch-shapes.ts';
import { createLineSplitter, checkOpenAILine, isLineError, windowMs, type CheckedLine, type LineError } from '../../core/batch-lines.ts';
import { newId } from '../../core/ids.ts';
import type { Dialect } from '../../core/dialects.ts';
import { withTransaction } from '../../db/pool.ts';
import { readFilePiece, findFile } from '../../db/files.ts';
import {
  insertBatch, insertLines, setBatchTotal, duplicateCustomIds, findBatch, listBatches, cancelBatch, type NewBatch, type BatchView, type Vendor,
} from '../../db/batches.ts';
import { readJsonDocument, MAX_SUBMISSION_BYTES } from '../body.ts';
import { serviceAuthOf } from '../service-auth.ts';
import { vendorRoute, sendJson, limitParam, idParam } from './vendor-routes.ts';

const RUN = 500;
// The vendor names at most this many lines in `errors`.
const MAX_ERRORS = 100;

const ENDPOINTS: Readonly<Record<string, Dialect>> = { '/v1/chat/completions': 'chat', '/v1/responses': 'responses' };

class Invalid extends Error {
  readonly errors: LineError[];
  constructor(errors: LineError[]) {
    super('invalid batch input');
    this.errors = errors;
  }
}

/**
 * Writes a batch and its lines in one transaction. Answers null, or the validation errors of an
 * input that broke the format: the batch is then recorded `failed`, with no lines.
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

/** An uploaded file's lines, checked one by one as its pieces are read. */
async function* fileLines(deps: Deps, fileId: string, endpoint: string): AsyncGenerator<CheckedLine | LineError> {
  const splitter = createLineSplitter();
  let n = 0;
  function* checked(lines: Buffer[]) {
    for (const bytes of lines) {
      n++;
      if (bytes.toString('latin1').trim() === '') continue;
      yield checkOpenAILine(bytes, n, endpoint, MAX_SUBMISSION_BYTES);
    }
  }
  for (let seq = 0; ; seq++) {
    const piece = await readFilePiece(deps.pool, fileId, seq);
    if (piece === null) break;
    yield* checked(splitter.feed(piece));
  }
  yield* checked(splitter.finish());
}

/** Metadata as the vendor takes it: up to 16 string values, or null. */
export function metadataOf(value: unknown): Record<string, string> | null {
  if (value === undefined || value === null) return null;
  const ok = typeof value === 'object' && !Array.isArray(value) && Object.keys(value).length <= 16 &&
    Object.entries(value).every(([k, v]) => k.length <= 64 && typeof v === 'string' && v.length <= 512 && !`${k}${v}`.includes('\u0000'));
  if (!ok) throw new ServiceError('bad_request', '`metadata` must be an object of at most 16 string values.');
  return value as Record<string, string>;
}

async function create(deps: Deps, req: Request, res: Response): Promise<void> {
  const auth = serviceAuthOf(res);
  const body = (await readJsonDocument(req)) as Record<string, unknown> | null;
  if (body === null || typeof body !== 'object' || Array.isArray(body)) throw new ServiceError('bad_request', 'The body must be a JSON object.');
  const endpoint = body.endpoint;
  if (typeof endpoint !== 'string' || !Object.hasOwn(ENDPOINTS, endpoint)) {
    throw new ServiceError('bad_request', `\`endpoint\` must be one of ${Object.keys(ENDPOINTS).join(', ')}.`);
  }
  const window = windowMs(body.completion_window);
  if (window === null) throw new ServiceError('bad_request', '`completion_window` must be `24h` (Sarsen also takes a shorter one, such as `30m`).');
  if (typeof body.input_file_id !== 'string') throw new ServiceError('bad_request', '`input_file_id` must be a file id.');
  const metadata = metadataOf(body.metadata);
  const file = await findFile(deps.pool, auth.namespaceId, body.input_file_id);
  if (!file || file.batch_id !== null) throw new ServiceError('not_found', `No input file with id ${JSON.stringify(body.input_file_id.slice(0, 100))} in this namespace.`);
  const batch: NewBatch = {
    id: newId('batch'),
    vendor: 'openai',
    tenancyId: auth.tenancyId,
    namespaceId: auth.namespaceId,
    apiKeyId: auth.apiKeyId,
    dialect: ENDPOINTS[endpoint]!,
    endpoint,
    inputFileId: file.id,
    completionWindow: body.completion_window as string,
    windowMs: window,
    metadata,
  };
  await acceptBatch(deps, batch, fileLines(deps, file.id, endpoint));
  sendJson(res, openaiBatch((await findBatch(deps.pool, auth.namespaceId, batch.id, 'openai'))!));
}

export async function foundBatch(deps: Deps, res: Response, id: string, vendor: Vendor): Promise<BatchView> {
  const batch = await findBatch(deps.pool, serviceAuthOf(res).namespaceId, id, vendor);
  if (!batch) throw new ServiceError('not_found', `No batch with id ${JSON.stringify(id.slice(0, 100))} in this namespace.`);
  return batch;
}

async function retrieve(deps: Deps, req: Request, res: Response): Promise<void> {
  sendJson(res, openaiBatch(await foundBatch(deps, res, String(req.params.id), 'openai')));
}

/** Cancel: lines not yet started end at once; those in flight end on their own, then the batch is `cancelled`. */
async function cancel(deps: Deps, req: Request, res: Response): Promise<void> {
  const batch = await foundBatch(deps, res, String(req.params.id), 'openai');
  await cancelBatch(deps.pool, batch.namespace_id, batch.id, 'openai');
  sendJson(res, openaiBatch(await foundBatch(deps, res, batch.id, 'openai')));
}

async function list(deps: Deps, req: Request, res: Response): Promise<void> {
  const limit = limitParam(req, 20, 100);
  const rows = await listBatches(deps.pool, serviceAuthOf(res).namespaceId, 'openai', { after: idParam(req, 'after'), before: null, limit: limit + 1 });
  const page = rows.slice(0, limit);
  sendJson(res, { object: 'list', data: page.map(openaiBatch), first_id: page[0]?.id ?? null, last_id: page.at(-1)?.id ?? null, has_more: rows.length > limit });
}

export function batchRoutes(deps: Deps, router: Router, base: string, use: RequestHandler): void {
  router.post(`${base}/batches`, use, vendorRoute(deps, create));
  router.get(`${base}/batches`, use, vendorRoute(deps, list));
  router.get(`${base}/batches/:id`, use, vendorRoute(deps, retrieve));
  router.post(`${base}/batches/:id/cancel`, use, vendorRoute(deps, cancel));
}
