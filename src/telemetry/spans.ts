// Sarsen's spans below the caller's request (docs/operations.md "Tracing"): acceptance with its
// group commit, each attempt (continuing the request's trace, or linked to it when recovered),
// the provider call in the GenAI conventions with its stream's frames and commits as counts and
// events, and settlement. Called only when `tracer` is set; the spans carry ids, names, counts
// and enumerated values, never a prompt, an answer, a credential or a key secret.
import { GENAI, OPERATION, providerName, answerFacts, createStreamFacts, type ResponseFacts } from '../core/genai.ts';
import type { Dialect } from '../core/dialects.ts';
import { context, trace, SpanKind, SpanStatusCode, contextOf, linkTo, activeSpan, within, failed, traceparentOf, type Span, type Tracer } from './tracing.ts';

// Submissions and terminal writes waiting in a group commit, by writer and request id, so the
// flush that takes them can tell each its batch and its wait for the lane.
const waiting = new Map<string, { span: Span; since: number }>();

/** A group commit's flush starts: each traced item's span learns its batch size, lane and wait. */
export function flushing(writer: string, ids: readonly string[], lane: number): void {
  const now = performance.now();
  for (const id of ids) {
    const w = waiting.get(writer + id);
    if (!w) continue;
    w.span.setAttribute('sarsen.group_commit.batch_size', ids.length);
    w.span.setAttribute('sarsen.group_commit.lane', lane);
    w.span.setAttribute('sarsen.group_commit.wait_ms', Math.round((now - w.since) * 1000) / 1000);
    w.span.addEvent('sarsen.group_commit.flush');
  }
}

/** The flush committed. */
export function committed(writer: string, ids: readonly string[]): void {
  for (const id of ids) waiting.get(writer + id)?.span.addEvent('sarsen.group_commit.committed');
}

/** Runs a group commit's flush, telling the traced items of its batch when it starts and when it committed. */
export async function tracedFlush<T>(writer: string, ids: readonly string[], lane: number, flush: () => Promise<T>): Promise<T> {
  flushing(writer, ids, lane);
  const result = await flush();
  committed(writer, ids);
  return result;
}

async function inGroupCommit<T>(writer: string, id: string, span: Span, fn: () => Promise<T>): Promise<T> {
  waiting.set(writer + id, { span, since: performance.now() });
  try {
    return await within(span, fn);
  } finally {
    waiting.delete(writer + id);
  }
}

/** The W3C traceparent of the current span (the caller's request), stored with what it creates. */
export function currentTraceParent(): string | null {
  const span = activeSpan();
  return span ? traceparentOf(span) : null;
}

export type AcceptedFacts = { requestId: string; attached: boolean; cachedFrom: string | null };

/** Acceptance of submission `id`: its group commit (batch size, lane, wait for the lane) and what it landed on. */
export async function traceAcceptance<T extends AcceptedFacts>(tracer: Tracer, id: string, dialect: Dialect, streaming: boolean, fn: () => Promise<T>): Promise<T> {
  const span = tracer.startSpan('sarsen.accept', { attributes: { 'sarsen.dialect': dialect, 'sarsen.streaming': streaming } });
  const accepted = await inGroupCommit('accept:', id, span, fn);
  span.setAttribute('sarsen.request.id', accepted.requestId);
  span.setAttribute('sarsen.attached', accepted.attached);
  span.setAttribute('sarsen.cache.hit', accepted.cachedFrom !== null);
  return accepted;
}

/**
 * An attempt's span. It continues the trace its request was accepted in; an attempt after a
 * recovery (another process, perhaps minutes later) starts a trace of its own, linked to that one.
 */
export type AttemptFacts = Readonly<{ id: string; attempt: number; namespaceId: string; dialect: Dialect; streaming: boolean; recoveries: number; traceParent: string | null }>;

export function traceAttempt(tracer: Tracer, a: AttemptFacts, fn: () => Promise<void>): Promise<void> {
  const recovered = a.recoveries > 0;
  const link = recovered ? linkTo(a.traceParent, { 'sarsen.link': 'recovered_from' }) : null;
  const span = tracer.startSpan(
    'sarsen.attempt',
    {
      kind: SpanKind.CONSUMER,
      attributes: {
        'sarsen.request.id': a.id, 'sarsen.namespace.id': a.namespaceId, 'sarsen.dialect': a.dialect, 'sarsen.streaming': a.streaming,
        'sarsen.attempt': a.attempt, 'sarsen.recoveries': a.recoveries,
      },
      ...(link ? { links: [link] } : {}),
    },
    recovered ? contextOf(null) : contextOf(a.traceParent),
  );
  return within(span, fn);
}

/** The attempt waited for acceptance to go quiet before its provider call (docs/durability.md "Acceptance first"). */
export function attemptYielded(): void {
  activeSpan()?.addEvent('sarsen.yielded');
}

/** How the attempt ended (succeeded, failed, retry, lease_lost, handed_back), on the attempt's span. */
export function attemptEnded(kind: string): void {
  const span = activeSpan();
  span?.setAttribute('sarsen.outcome', kind);
  if (kind !== 'succeeded' && kind !== 'retry') span?.setStatus({ code: SpanStatusCode.ERROR });
}

/** Settlement of an attempt: its group commit, fenced on the attempt. */
export function traceSettle<T>(tracer: Tracer, id: string, kind: string, fn: () => Promise<T>): Promise<T> {
  return inGroupCommit('settle:', id, tracer.startSpan('sarsen.settle', { attributes: { 'sarsen.outcome': kind } }), fn);
}

export type CallFacts = Readonly<{ dialect: Dialect; backendDialect: 'chat' | 'messages'; model: string; address: string }>;

/** What the provider call's span is told as it goes; every method is cheap and allocation-light. */
export type CallTrace = {
  answered(status: number): void;
  answer(body: Buffer): void;
  frames(frames: readonly Buffer[], firstSeq: number): void;
  committed(count: number): void;
  tokens(input: number | null, output: number | null): void;
};

function serverOf(address: string): { host: string | null; port: number | null } {
  try {
    const u = new URL(address);
    return { host: u.hostname, port: u.port === '' ? (u.protocol === 'https:' ? 443 : 80) : Number(u.port) };
  } catch {
    return { host: null, port: null };
  }
}

/** The provider call: a client span in the GenAI conventions, named `chat <model>`. */
export async function traceProviderCall<T>(tracer: Tracer, c: CallFacts, fn: (call: CallTrace) => Promise<T>): Promise<T> {
  const server = serverOf(c.address);
  const span = tracer.startSpan(`${OPERATION} ${c.model}`, {
    kind: SpanKind.CLIENT,
    attributes: {
      [GENAI.operation]: OPERATION, [GENAI.provider]: providerName(c.backendDialect), [GENAI.requestModel]: c.model,
      ...(server.host ? { 'server.address': server.host, 'server.port': server.port! } : {}),
    },
  });
  let facts: ResponseFacts | null = null;
  let stream: ReturnType<typeof createStreamFacts> | null = null;
  let frames = 0;
  let commits = 0;
  let durable = 0;
  const call: CallTrace = {
    answered(status) {
      span.setAttribute('http.response.status_code', status);
      if (status >= 400) span.setAttribute('error.type', String(status));
    },
    answer(body) {
      facts = answerFacts(c.dialect, body);
    },
    frames(batch, firstSeq) {
      if (frames === 0 && batch.length > 0) span.addEvent('sarsen.first_frame', { 'sarsen.seq': firstSeq });
      stream ??= createStreamFacts(c.dialect);
      for (const f of batch) stream.push(f);
      frames += batch.length;
    },
    committed(count) {
      if (commits === 0) span.addEvent('sarsen.first_frame_committed');
      commits++;
      durable += count;
    },
    tokens(input, output) {
      if (input !== null) span.setAttribute(GENAI.inputTokens, input);
      if (output !== null) span.setAttribute(GENAI.outputTokens, output);
    },
  };
  try {
    return await context.with(trace.setSpan(context.active(), span), () => fn(call));
  } catch (err) {
    failed(span, err);
    throw err;
  } finally {
    const f: ResponseFacts | null = stream ? (stream as ReturnType<typeof createStreamFacts>).result() : facts;
    if (f) {
      if (f.id) span.setAttribute(GENAI.responseId, f.id);
      if (f.model) span.setAttribute(GENAI.responseModel, f.model);
      if (f.finishReasons.length > 0) span.setAttribute(GENAI.finishReasons, f.finishReasons);
    }
    if (stream) {
      span.setAttribute('sarsen.stream.frames', frames);
      span.setAttribute('sarsen.stream.commits', commits);
      span.setAttribute('sarsen.stream.frames_committed', durable);
      if (commits > 0) span.addEvent('sarsen.last_frame_committed');
    }
    span.end();
  }
}

/** A replay by id: a span of its own under the reader's request, linked to the trace of the request it replays. */
export function traceReplay<T>(tracer: Tracer, requestId: string, traceParent: string | null, fn: () => Promise<T>): Promise<T> {
  const link = linkTo(traceParent, { 'sarsen.link': 'replay_of' });
  const span = tracer.startSpan('sarsen.replay', { attributes: { 'sarsen.request.id': requestId }, ...(link ? { links: [link] } : {}) });
  return within(span, fn);
}

/** A link from the current request's span (and the acceptance's) to the trace of the execution it attached to. */
export function linkAttached(spans: readonly (Span | undefined)[], traceParent: string | null): void {
  const link = linkTo(traceParent, { 'sarsen.link': 'attached_to' });
  if (link) for (const s of spans) s?.addLink(link);
}
