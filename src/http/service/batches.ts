// OpenAI's Batches API (docs/api.md "Batches"): the input file is read line by line (its pieces,
// streamed) and accepted as both vendors' batches are (acceptBatch). An input that breaks the
// format fails as a whole with the vendor's `errors` naming the lines.
import type { Request, Response, Router, RequestHandler } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { openaiBatch } from '../../core/batch-shapes.ts';
import { createLineSplitter, checkOpenAILine, windowMs, type CheckedLine, type LineError } from '../../core/batch-lines.ts';
import { metadataOf, openaiList } from '../../core/vendor-api.ts';
import { newId } from '../../core/ids.ts';
import type { Dialect } from '../../core/dialects.ts';
import { readFilePiece, findFile } from '../../db/files.ts';
import { findBatch, listBatches, cancelBatch, type NewBatch } from '../../db/batches.ts';
import { readJsonDocument, MAX_SUBMISSION_BYTES } from '../body.ts';
import { serviceAuthOf } from '../service-auth.ts';
import { vendorRoute, sendJson, limitParam, idParam, acceptBatch, foundBatch } from './vendor-routes.ts';

const ENDPOINTS: Readonly<Record<string, Dialect>> = { '/v1/chat/completions': 'chat', '/v1/responses': 'responses' };

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
  sendJson(res, openaiList(rows, limit, openaiBatch));
}

export function batchRoutes(deps: Deps, router: Router, base: string, use: RequestHandler): void {
  router.post(`${base}/batches`, use, vendorRoute(deps, create));
  router.get(`${base}/batches`, use, vendorRoute(deps, list));
  router.get(`${base}/batches/:id`, use, vendorRoute(deps, retrieve));
  router.post(`${base}/batches/:id/cancel`, use, vendorRoute(deps, cancel));
}
