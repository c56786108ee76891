// GET /requests/{id} as JSON (docs/api.md "The request record"): the JSON text is built around
// the stored answer bytes, so `response` is embedded exactly as stored, never re-serialised.
import type { Request, Response } from 'express';
import type { Deps } from '../../deps.ts';
import { readRecord, requestTraceParent, type RecordRow } from '../../db/requests.ts';
import { ServiceError } from '../../core/errors.ts';
import { replay } from './streams.ts';
import { trackStream } from '../../metrics/metrics.ts';
import { tracer } from '../../telemetry/tracing.ts';
import { traceReplay } from '../../telemetry/spans.ts';

/** Whether `bytes` hold one JSON object (what `response` and `error` must be). */
function isJsonObjectText(bytes: Buffer): boolean {
  try {
    const v: unknown = JSON.parse(bytes.toString('utf8'));
    return v !== null && typeof v === 'object' && !Array.isArray(v);
  } catch {
    return false;
  }
}

/**
 * A stored body that is not one JSON object (an HTML error page from a proxy, say) is kept,
 * as text, inside one, beside the content type it came with, so a reader can tell the
 * wrapper from a provider's own JSON.
 */
function asObject(bytes: Buffer, contentType: string | null): string {
  return isJsonObjectText(bytes) ? bytes.toString('utf8') : JSON.stringify({ body: bytes.toString('utf8'), content_type: contentType });
}

export function recordJson(record: RecordRow): string {
  const head = JSON.stringify({
    request_id: record.id,
    status: record.status,
    dialect: record.dialect,
    streaming: record.streaming,
    backend_id: record.backend_id,
    attempts: record.attempts,
    recoveries: record.recoveries,
    next_retry_at: record.next_retry_at ? record.next_retry_at.toISOString() : null,
    attempt_log: record.attempt_log,
  });
  const tail: string[] = [];
  // Only on a request the response cache answered (docs/api.md "Response cache").
  if (record.cached_from !== null) tail.push(`"cached_from":${JSON.stringify(record.cached_from)}`);
  if (record.status === 'succeeded' && !record.streaming && record.response_body) {
    tail.push(`"response":${asObject(record.response_body, record.response_content_type)}`);
  }
  if (record.status === 'failed' && record.response_body) {
    tail.push(`"error":${asObject(record.response_body, record.response_content_type)}`);
    if (record.error_status !== null) tail.push(`"error_status":${record.error_status}`);
    // retry_after is the provider's header verbatim, absent when it sent none (docs/api.md "The
    // request record").
    if (record.error_status !== null && record.retry_after !== null) tail.push(`"retry_after":${JSON.stringify(record.retry_after)}`);
  }
  return tail.length === 0 ? head : `${head.slice(0, -1)},${tail.join(',')}}`;
}

/** GET .../requests/{id}: the record as JSON, or with Accept: text/event-stream its stream replayed. */
export async function readRequest(deps: Deps, req: Request, res: Response, namespaceId: string): Promise<void> {
  const record = await readRecord(deps.pool, namespaceId, String(req.params.id));
  if (!record) throw new ServiceError('not_found', 'No such request in this namespace.');
  if (record.expired) throw new ServiceError('record_expired');
  if (/\btext\/event-stream\b/i.test(req.headers.accept ?? '')) {
    if (!record.streaming) {
      throw new ServiceError('bad_request', 'This request was not streamed; read it as JSON (without Accept: text/event-stream).');
    }
    const replaying = () => replay(deps, req, res, { id: record.id, namespaceId: record.namespace_id, streaming: true });
    // Traced, the replay is a span of its own linked to the request's trace (docs/operations.md "Tracing").
    const t = tracer;
    const traced = t === null ? replaying : async () => traceReplay(t, record.id, await requestTraceParent(deps.pool, record.id).catch(() => null), replaying);
    await trackStream('replay', traced);
    return;
  }
  res.status(200).set('content-type', 'application/json').send(recordJson(record));
}
