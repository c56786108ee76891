// The server span of each caller's request, when tracing is on (docs/operations.md "Tracing"):
// it joins the caller's trace when a W3C `traceparent` comes in (that header is still never
// forwarded to a provider: src/core/header-policy.ts), and when the answer ends it takes the
// route, the status and what the route learnt of the submission (src/http/observe.ts).
import type { Request, Response, NextFunction } from 'express';
import { propagation } from '@opentelemetry/api';
import { context, trace, ROOT_CONTEXT, SpanKind, SpanStatusCode, type Span, type Tracer } from '../telemetry/tracing.ts';
import { observedOf } from './observe.ts';
import type { ServiceAuth } from './service-auth.ts';

// Probes and scrapes are not requests anybody traces.
const UNTRACED = /^\/(healthz|readyz|metrics|openapi\.json|console(\/|$))/;

/** The caller's request span of this answer (undefined: not traced). */
export const requestSpanOf = (res: Response): Span | undefined => (res.locals as { span?: Span }).span;

export function serverSpans(tracer: Tracer) {
  return (req: Request, res: Response, next: NextFunction): void => {
    if (UNTRACED.test(req.path)) return next();
    const parent = propagation.extract(ROOT_CONTEXT, req.headers);
    const span = tracer.startSpan(
      req.method,
      { kind: SpanKind.SERVER, attributes: { 'http.request.method': req.method, 'url.path': req.path, 'url.scheme': 'http' } },
      parent,
    );
    (res.locals as { span?: Span }).span = span;
    const active = trace.setSpan(parent, span);
    // Listeners on the answer (the access log's among them) run in the request's context.
    context.bind(active, res);
    res.once('close', () => {
      if (req.route) {
        const route = `${req.baseUrl}${String(req.route.path)}`;
        span.updateName(`${req.method} ${route}`);
        span.setAttribute('http.route', route);
      }
      const status = res.headersSent ? res.statusCode : 499;
      span.setAttribute('http.response.status_code', status);
      const auth = (res.locals as { auth?: ServiceAuth }).auth;
      if (auth) {
        span.setAttribute('sarsen.tenancy', auth.tenancySlug);
        span.setAttribute('sarsen.namespace', auth.namespaceName);
        span.setAttribute('sarsen.key.prefix', auth.apiKeyPrefix);
      }
      const o = observedOf(res);
      if (o.requestId !== undefined) span.setAttribute('sarsen.request.id', o.requestId);
      if (o.attached !== undefined) span.setAttribute('sarsen.attached', o.attached);
      if (o.cached !== undefined) span.setAttribute('sarsen.cache.hit', o.cached);
      if (o.errorCode !== undefined) span.setAttribute('sarsen.error.code', o.errorCode);
      if (status >= 500) span.setStatus({ code: SpanStatusCode.ERROR });
      span.end();
    });
    context.with(active, next);
  };
}
