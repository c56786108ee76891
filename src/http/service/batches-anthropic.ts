// Anthropic's Message Batches API (docs/api.md "Batches"): the requests come inline, in a body
// of up to `message_batch_max_bytes` (above the 2 MiB submission limit), checked whole before
// anything is written, as the vendor does; then accepted like an OpenAI batch. Results are JSONL
// at the batch's `results_url`, built from the lines' stored answers as they are read. Errors
// are the vendor's shape, so its SDK raises its own classes.
import type { Request, Response, Router, RequestHandler } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { anthropicBatch, anthropicResultLine } from '../../core/batch-shapes.ts';
import { anthropicErrorBody, anthropicList } from '../../core/vendor-api.ts';
import { lineBody, type CheckedLine } from '../../core/batch-lines.ts';
import { parseCanonical, isJsonObject, CanonicalJsonError, type JsonValue } from '../../core/canonical-json.ts';
import { newId } from '../../core/ids.ts';
import { readBody, decodeUtf8, MAX_SUBMISSION_BYTES } from '../body.ts';
import { listBatches, cancelBatch, deleteBatch, resultPage, type BatchView } from '../../db/batches.ts';
import { serviceAuthOf } from '../service-auth.ts';
import { vendorRoute, sendJson, limitParam, idParam, acceptBatch, foundBatch } from './vendor-routes.ts';
import { send } from './streams.ts';

const RESULT_PAGE = 500;
const CUSTOM_ID = /^[a-zA-Z0-9_-]{1,64}$/;

const route = (deps: Deps, handler: (deps: Deps, req: Request, res: Response) => Promise<void>) => vendorRoute(deps, handler, anthropicErrorBody);

/** Where a batch's results are: absolute, as the vendor gives it; the SDK follows it with the caller's key. */
function resultsUrl(req: Request, id: string): string {
  return `${req.protocol}://${req.get('host')}/${req.params.tenancy}/${req.params.namespace}/v1/messages/batches/${id}/results`;
}

const view = (req: Request, b: BatchView) => anthropicBatch(b, resultsUrl(req, b.id));

/** The inline requests, checked whole: a line that breaks the format refuses the batch, naming it. */
function checkRequests(value: JsonValue, maxLines: number): CheckedLine[] {
  if (!isJsonObject(value) || !Array.isArray(value.requests)) throw new ServiceError('bad_request', 'requests: the body must hold a `requests` array.');
  const requests = value.requests;
  if (requests.length === 0) throw new ServiceError('bad_request', 'requests: the array is empty.');
  if (requests.length > maxLines) throw new ServiceError('bad_request', `requests: more than ${maxLines} requests, this deployment's batch_max_lines.`);
  const seen = new Map<string, number>();
  return requests.map((r, i) => {
    if (!isJsonObject(r)) throw new ServiceError('bad_request', `requests.${i}: must be an object.`);
    const customId = r.custom_id;
    if (typeof customId !== 'string' || !CUSTOM_ID.test(customId)) throw new ServiceError('bad_request', `requests.${i}.custom_id: must be 1 to 64 letters, digits, - or _.`);
    const earlier = seen.get(customId);
    if (earlier !== undefined) throw new ServiceError('bad_request', `requests.${i}.custom_id: repeats the custom_id of requests.${earlier}.`);
    seen.set(customId, i);
    if (r.params === undefined || !isJsonObject(r.params)) throw new ServiceError('bad_request', `requests.${i}.params: must be an object.`);
    return lineBody(r.params, i + 1, customId, MAX_SUBMISSION_BYTES);
  });
}

async function* each(lines: CheckedLine[]): AsyncGenerator<CheckedLine> {
  yield* lines;
}

async function create(deps: Deps, req: Request, res: Response): Promise<void> {
  const auth = serviceAuthOf(res);
  const settings = deps.settings.current();
  let value: JsonValue;
  try {
    value = parseCanonical(decodeUtf8(await readBody(req, settings.message_batch_max_bytes))).value;
  } catch (err) {
    if (err instanceof CanonicalJsonError) throw new ServiceError('bad_request', `The body is not valid JSON: ${err.message}`);
    throw err;
  }
  const lines = checkRequests(value, settings.batch_max_lines);
  value = null;
  const id = newId('msgbatch');
  await acceptBatch(deps, {
    id, vendor: 'anthropic', tenancyId: auth.tenancyId, namespaceId: auth.namespaceId, apiKeyId: auth.apiKeyId,
    dialect: 'messages', endpoint: '/v1/messages', inputFileId: null, completionWindow: '24h', windowMs: settings.message_batch_window_ms, metadata: null,
  }, each(lines));
  sendJson(res, view(req, await foundBatch(deps, res, id, 'anthropic')));
}

async function retrieve(deps: Deps, req: Request, res: Response): Promise<void> {
  sendJson(res, view(req, await foundBatch(deps, res, String(req.params.id), 'anthropic')));
}

async function list(deps: Deps, req: Request, res: Response): Promise<void> {
  const limit = limitParam(req, 20, 1000);
  const after = idParam(req, 'after_id');
  const before = idParam(req, 'before_id');
  const rows = await listBatches(deps.pool, serviceAuthOf(res).namespaceId, 'anthropic', { after, before, limit: limit + 1 });
  // Newest first; a page before `before_id` is the newer ones nearest to it.
  sendJson(res, anthropicList(rows, limit, (b) => view(req, b), before !== null));
}

async function cancel(deps: Deps, req: Request, res: Response): Promise<void> {
  const batch = await foundBatch(deps, res, String(req.params.id), 'anthropic');
  await cancelBatch(deps.pool, batch.namespace_id, batch.id, 'anthropic');
  sendJson(res, view(req, await foundBatch(deps, res, batch.id, 'anthropic')));
}

async function remove(deps: Deps, req: Request, res: Response): Promise<void> {
  const batch = await foundBatch(deps, res, String(req.params.id), 'anthropic');
  if (batch.ended_at === null) throw new ServiceError('conflict', 'The batch is still processing: cancel it, or wait for it to end, before deleting it.');
  await deleteBatch(deps.pool, batch.namespace_id, batch.id);
  sendJson(res, { id: batch.id, type: 'message_batch_deleted' });
}

async function results(deps: Deps, req: Request, res: Response): Promise<void> {
  const batch = await foundBatch(deps, res, String(req.params.id), 'anthropic');
  if (batch.ended_at === null) throw new ServiceError('bad_request', 'The batch has not ended: its results are ready once processing_status is `ended`.');
  res.status(200).set('content-type', 'application/x-jsonl');
  for (let after = 0; ; ) {
    const page = await resultPage(deps.pool, batch.id, after, RESULT_PAGE);
    const text = page.map(anthropicResultLine).join('');
    if (text.length > 0) await send(res, text);
    if (page.length < RESULT_PAGE) break;
    after = page.at(-1)!.line;
  }
  res.end();
}

export function messageBatchRoutes(deps: Deps, router: Router, base: string, use: RequestHandler): void {
  router.post(`${base}/messages/batches`, use, route(deps, create));
  router.get(`${base}/messages/batches`, use, route(deps, list));
  router.get(`${base}/messages/batches/:id`, use, route(deps, retrieve));
  router.post(`${base}/messages/batches/:id/cancel`, use, route(deps, cancel));
  router.delete(`${base}/messages/batches/:id`, use, route(deps, remove));
  router.get(`${base}/messages/batches/:id/results`, use, route(deps, results));
}
