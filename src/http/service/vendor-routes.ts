// What the routes of the vendors' own APIs share (docs/api.md "Background responses", "Batches"):
// errors in the vendor's shape, so its SDK raises its own classes, JSON answers and the list
// parameters.
import type { Request, Response, RequestHandler } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { vendorErrorBody } from '../../core/background.ts';
import { answerErrorsAs, sendError, type ErrorShape } from '../app.ts';

/**
 * A route whose errors answer in a vendor's error shape (docs/api.md "Errors"), so its SDK
 * raises its own classes: those the handler raises, and those the application's error handler
 * translates (an outage's 503, text PostgreSQL cannot store, an internal fault).
 */
export function vendorRoute(deps: Deps, handler: (deps: Deps, req: Request, res: Response) => Promise<void>, shape: ErrorShape = vendorErrorBody): RequestHandler {
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

export const sendJson = (res: Response, value: unknown): void => {
  res.status(200).set('content-type', 'application/json').send(JSON.stringify(value));
};

/** A limit query parameter from 1 to `max`. */
export function limitParam(req: Request, fallback: number, max: number): number {
  const v = req.query.limit;
  if (v === undefined) return fallback;
  const n = typeof v === 'string' && /^\d{1,7}$/.test(v) ? Number(v) : NaN;
  if (!(n >= 1 && n <= max)) throw new ServiceError('bad_request', `\`limit\` must be an integer from 1 to ${max}.`);
  return n;
}

export function idParam(req: Request, name: string): string | null {
  const v = req.query[name];
  if (v === undefined) return null;
  if (typeof v !== 'string' || v.length > 200) throw new ServiceError('bad_request', `\`${name}\` must be an id.`);
  return v;
}
