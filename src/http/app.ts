// The express application: health routes, the routers later parts mount, the 404 fallback and
// the one error handler that turns everything into the error envelope (docs/api.md "Errors").
import express from 'express';
import type { Request, Response, NextFunction, Router } from 'express';
import crypto from 'node:crypto';
import { ServiceError, ERROR_CODES, errorBody, type ErrorCode } from '../core/errors.ts';
import { connectionFailed, isConnectionLoss } from '../db/pool.ts';
import { bodyWasAbandoned, ClientAborted } from './body.ts';
import { isNulRefused } from '../db/pg-errors.ts';
import { logger, errorFields } from '../log.ts';
import { observeRequests, observedOf } from './observe.ts';
import { exposition } from '../metrics/metrics.ts';
import { tracer } from '../telemetry/tracing.ts';
import { serverSpans } from './tracing.ts';
import { ADMIN_PATH } from './admin/index.ts';

// Seconds a caller is asked to wait before retrying while the database is unreachable.
const UNAVAILABLE_RETRY_AFTER_S = 1;
// How long /readyz waits for the database to answer before it says it does not: under a probe's
// own timeout (a second, by default, in Kubernetes), so a silent database reads as 503, not as
// no answer (docs/operations.md "When the network goes silent").
const READY_WAIT_MS = 900;

export type Readiness = () => Promise<boolean>;

// A caller whose SDK was pointed at something Sarsen does not serve (a model listing, token
// counting, embeddings, a provider's stored response, a base address with one /v1 too many)
// learns what it does serve (docs/api.md "Routes that do not exist").
const SERVED =
  'Sarsen serves, under /{tenancy}/{namespace}/v1: POST /chat/completions, POST /messages, POST /responses, ' +
  'POST /requests?dialect=chat|messages|responses, GET /requests/{id} (the record, or its stream replayed), ' +
  'GET /requests/{id}/summary, POST /requests/{id}/cancel, GET /requests, GET /requests/export, GET /usage, GET /storage, and GET, DELETE /responses/{id}, ' +
  'POST /responses/{id}/cancel and GET /responses/{id}/input_items (background responses), ' +
  '/files and /batches (OpenAI batches) and /messages/batches (Anthropic message batches). ' +
  'There is no model-listing, token-counting or embeddings route.';

/** An error body in some API's shape: Sarsen's envelope, or a vendor's (docs/api.md "Errors"). */
export type ErrorShape = (code: ErrorCode, status: number, message: string) => string;

/** Makes every error `res` answers from here on, whatever raised it, take `shape` (the vendors' routes). */
export function answerErrorsAs(res: Response, shape: ErrorShape): void {
  (res.locals as { errorShape?: ErrorShape }).errorShape = shape;
}

export function sendError(res: Response, code: ErrorCode, status: number, message: string): void {
  observedOf(res).errorCode = code;
  const shape = (res.locals as { errorShape?: ErrorShape }).errorShape;
  res.status(status).set('content-type', 'application/json').send(shape ? shape(code, status, message) : errorBody(code, message));
}

/** Bearer token check for /metrics: constant time, and only when a token is configured. */
function metricsAllowed(req: Request, token: string | null): boolean {
  if (token === null) return true;
  const m = /^\s*bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '');
  const given = crypto.createHash('sha256').update(m?.[1] ?? '').digest();
  return m !== null && crypto.timingSafeEqual(given, crypto.createHash('sha256').update(token).digest());
}

export function createApp(opts: { ready: Readiness; routers?: Router[]; metricsToken?: string | null; openapi?: () => unknown }): express.Express {
  const app = express();
  app.disable('x-powered-by');
  app.disable('etag');
  app.set('query parser', 'simple');
  // Before the access log, so its line is written in the request's trace.
  if (tracer !== null) app.use(serverSpans(tracer));
  app.use(observeRequests());

  app.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' });
  });
  app.get('/readyz', async (_req, res) => {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<false>((resolve) => (timer = setTimeout(resolve, READY_WAIT_MS, false)));
    const ok = await Promise.race([opts.ready().catch(() => false), late]);
    clearTimeout(timer);
    res.status(ok ? 200 : 503).json({ status: ok ? 'ready' : 'unavailable' });
  });

  app.get('/metrics', async (req, res) => {
    if (!metricsAllowed(req, opts.metricsToken ?? null)) {
      res.set('www-authenticate', 'Bearer');
      throw new ServiceError('unauthorised', 'The metrics need Authorization: Bearer <metrics-token>.');
    }
    const { contentType, body } = await exposition();
    res.status(200).set('content-type', contentType).send(body);
  });
  if (opts.openapi) {
    const document = opts.openapi;
    app.get('/openapi.json', (_req, res) => {
      res.json(document());
    });
  }

  // No name or id holds U+0000 (PostgreSQL text cannot), so a path with an encoded NUL in any
  // segment names nothing: 404, for every route, before a parameter reaches a query.
  app.use((req: Request, res: Response, next: NextFunction) => {
    if (/%00/i.test(req.path)) sendError(res, 'not_found', 404, 'No name or id holds U+0000 (%00 in the path).');
    else next();
  });
  for (const router of opts.routers ?? []) app.use(router);

  app.use((req: Request, res: Response) => {
    const served = ADMIN_PATH.test(req.path) ? '' : ` ${SERVED}`;
    sendError(res, 'not_found', 404, `No route for ${req.method} ${req.path}.${served}`);
  });

  app.use((err: unknown, req: Request, res: Response, _next: NextFunction) => {
    if (err instanceof ClientAborted || (req.socket.destroyed && !res.headersSent)) {
      logger.info('client went away before it was answered', { method: req.method, path: req.path });
      res.destroy();
      return;
    }
    if (isConnectionLoss(err)) {
      // An outage: logged once per process (see pool.ts), answered 503 with a hint to retry.
      connectionFailed('database connection failed', err);
      if (res.headersSent) {
        res.destroy();
        return;
      }
      res.set('retry-after', String(UNAVAILABLE_RETRY_AFTER_S));
      sendError(res, 'unavailable', 503, ERROR_CODES.unavailable.message);
      return;
    }
    if (res.headersSent) {
      // Too late for an envelope: end the connection so the client sees the failure.
      logger.error('request failed after its answer began', errorFields(err));
      res.destroy();
      return;
    }
    if (bodyWasAbandoned(req)) {
      res.set('connection', 'close');
      res.on('finish', () => req.socket.end());
    }
    if (err instanceof ServiceError) {
      if (err.retryAfterSeconds !== undefined) res.set('retry-after', String(err.retryAfterSeconds));
      sendError(res, err.code, err.status, err.message);
      return;
    }
    if (isNulRefused(err)) {
      // A guard missed caller text holding U+0000 on its way to a text column: the caller's
      // input, not our fault. Logged so the missing guard is found.
      logger.warn('text holding U+0000 reached PostgreSQL', { method: req.method, route: req.route?.path });
      sendError(res, 'bad_request', 400, 'The request holds text with U+0000, which cannot be stored.');
      return;
    }
    if (err instanceof URIError) {
      sendError(res, 'bad_request', 400, 'The request path is malformed.');
      return;
    }
    // Anything else is our fault. The body says nothing of the cause; the log has it under a
    // reference the caller can quote.
    const reference = crypto.randomUUID();
    logger.error('unexpected fault', { reference, method: req.method, path: req.path, ...errorFields(err) });
    sendError(res, 'internal', 500, `Internal error (reference ${reference}).`);
  });
  return app;
}
