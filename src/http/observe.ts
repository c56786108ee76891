// One access-log line and the HTTP metrics per request, written when its answer ends: method,
// route pattern, status, duration and the request id when there is one. Never a body, a
// header, a key or a credential. Probes and scrapes log at debug, everything else at info.
import type { Request, Response, NextFunction } from 'express';
import { logger } from '../log.ts';
import { isDialect } from '../core/dialects.ts';
import { countSubmission, countHeldTooLong, observeHttp } from '../metrics/metrics.ts';

/** What a route tells the access log and the metrics about its request (res.locals.observed). */
export type Observed = { requestId?: string; attached?: boolean; cached?: boolean; errorCode?: string };

export function observedOf(res: Response): Observed {
  return ((res.locals as { observed?: Observed }).observed ??= {});
}

const QUIET_ROUTES = new Set(['/healthz', '/readyz', '/metrics', '/openapi.json']);
const SUBMISSION = /\/(chat\/completions|messages|responses|requests)$/;

function submissionDialect(route: string, req: Request): string | null {
  if (req.method !== 'POST') return null;
  const m = SUBMISSION.exec(route);
  if (!m) return null;
  if (m[1] === 'chat/completions') return 'chat';
  if (m[1] === 'messages' || m[1] === 'responses') return m[1];
  const d = req.query.dialect ?? 'chat';
  return isDialect(d) ? d : 'invalid';
}

export function observeRequests() {
  return (req: Request, res: Response, next: NextFunction): void => {
    const started = performance.now();
    res.once('close', () => {
      const seconds = (performance.now() - started) / 1000;
      const route = req.route ? `${req.baseUrl}${String(req.route.path)}` : 'unmatched';
      // A caller that left before an answer began: 499, as proxies log it.
      const status = res.headersSent ? res.statusCode : 499;
      const o = observedOf(res);
      observeHttp(route, req.method, status, seconds);
      const dialect = submissionDialect(route, req);
      if (dialect !== null) {
        const suffix = SUBMISSION.exec(route)![1]!;
        if (o.attached !== undefined) countSubmission(suffix, dialect, o.cached ? 'cached' : o.attached ? 'attached' : 'new');
        else countSubmission(suffix, dialect, 'refused', o.errorCode ?? 'other');
        if (o.errorCode === 'held_too_long') countHeldTooLong(suffix);
      }
      logger.log(QUIET_ROUTES.has(route) ? 'debug' : 'info', 'request', {
        method: req.method,
        route,
        status,
        duration_ms: Math.round(seconds * 10_000) / 10,
        request_id: o.requestId ?? (typeof req.params?.id === 'string' ? req.params.id : undefined),
        code: o.errorCode,
      });
    });
    next();
  };
}

/** Called by a submission route once its submission is accepted. */
export function noteSubmission(res: Response, sub: { requestId: string; attached: boolean; cachedFrom: string | null }): void {
  Object.assign(observedOf(res), { requestId: sub.requestId, attached: sub.attached, cached: sub.cachedFrom !== null });
}
