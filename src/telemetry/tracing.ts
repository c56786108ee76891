// OpenTelemetry tracing (docs/operations.md "Tracing"). Off unless the standard OTEL_*
// variables switch it on (src/config/config.ts); then `tracer` is set once, at startup, before
// anything is served. Every call site tests `tracer` first, so with tracing off the hot path
// builds no span, no context and no attribute object: the test of one variable is its whole cost.
// No prompt, answer, credential or key secret is ever an attribute or an event: what is set
// here are ids, names, counts and enumerated values.
import { context, trace, ROOT_CONTEXT, SpanKind, SpanStatusCode, type Attributes, type Context, type Link, type Span, type Tracer } from '@opentelemetry/api';
import { parseTraceParent } from '@opentelemetry/core';

/** The tracer when tracing is on; null when it is off. Set once, at startup, by setup.ts. */
export let tracer: Tracer | null = null;

let stop: (() => Promise<void>) | null = null;

/** Set by setup.ts: the tracer, and how to export what is left when the process stops. */
export function useTracer(t: Tracer | null, onStop: (() => Promise<void>) | null): void {
  tracer = t;
  stop = onStop;
}

/** Exports the spans still buffered; a stopping process calls it after its last request. */
export async function flushTracing(): Promise<void> {
  await stop?.();
}

/** The W3C traceparent of a span (stored with a request; never sent to a provider). */
export function traceparentOf(span: Span): string {
  const c = span.spanContext();
  return `00-${c.traceId}-${c.spanId}-0${(c.traceFlags & 1).toString(16)}`;
}

/** The span a stored traceparent names, as a parent context; the root context when there is none. */
export function contextOf(traceParent: string | null | undefined): Context {
  const parent = traceParent ? parseTraceParent(traceParent) : null;
  return parent ? trace.setSpanContext(ROOT_CONTEXT, { ...parent, isRemote: true }) : ROOT_CONTEXT;
}

/** A link to the span a stored traceparent names (none when there is none). */
export function linkTo(traceParent: string | null | undefined, attributes?: Attributes): Link | null {
  const target = traceParent ? parseTraceParent(traceParent) : null;
  return target ? { context: target, ...(attributes ? { attributes } : {}) } : null;
}

/** The span of the current context (the caller's request, inside a route). */
export const activeSpan = (): Span | undefined => trace.getSpan(context.active());

/** Runs `fn` with `span` current, ends it when `fn` settles, and marks it failed if `fn` threw. */
export async function within<T>(span: Span, fn: () => Promise<T>): Promise<T> {
  try {
    return await context.with(trace.setSpan(context.active(), span), fn);
  } catch (err) {
    failed(span, err);
    throw err;
  } finally {
    span.end();
  }
}

/** Marks a span failed by the error's type: never its message, which may echo what a provider said. */
export function failed(span: Span, err: unknown): void {
  const type = err instanceof Error ? err.name : 'error';
  span.setAttribute('error.type', type);
  span.setStatus({ code: SpanStatusCode.ERROR });
}

/** The trace and span ids of the current context, for log lines (src/log.ts). */
export function logFields(): { trace_id: string; span_id: string } | undefined {
  const span = trace.getSpan(context.active());
  if (!span) return undefined;
  const c = span.spanContext();
  return { trace_id: c.traceId, span_id: c.spanId };
}

export { SpanKind, SpanStatusCode, context, trace, ROOT_CONTEXT };
export type { Span, Tracer, Attributes, Context, Link };
