// The express application: health routes, the routers later parts mount, the 404 fallback and
// the one error handler that turns everything into SPEC.md's envelope.
import express from 'express';
import type { Request, Response, NextFunction, Router } from 'express';
import crypto from 'node:crypto';
import { ServiceError, errorBody, type ErrorCode } from '../core/errors.ts';
import { bodyWasAbandoned } from './body.ts';
import { logger, errorFields } from '../log.ts';

export type Readiness = () => Promise<boolean>;

export function sendError(res: Response, code: ErrorCode, status: number, message: string): void {
  res.status(status).set('content-type', 'application/json').send(errorBody(code, message));
}

export function createApp(opts: { ready: Readiness; routers?: Router[] }): express.Express {
  const app = express();
  app.disable('x-powered-by');
  app.disable('etag');
  app.set('query parser', 'simple');

  app.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' });
  });
  app.get('/readyz', async (_req, res) => {
    const ok = await opts.ready().catch(() => false);
    res.status(ok ? 200 : 503).json({ status: ok ? 'ready' : 'unavailable' });
  });

  for (const router of opts.routers ?? []) app.use(router);

  app.use((req: Request, res: Response) => {
    sendError(res, 'not_found', 404, `No route for ${req.method} ${req.path}.`);
  });

  app.use((err: unknown, req: Request, res: Response, _next: NextFunction) => {
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
      sendError(res, err.code, err.status, err.message);
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
