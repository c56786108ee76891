// GET /requests/{id} as JSON (SPEC.md "Request record"): the JSON text is built around the
// stored answer bytes, so `response` is embedded exactly as stored, never re-serialised.
import type { Request, Response } from 'express';
import type { Deps } from '../../deps.ts';
import { readRecord, type RecordRow } from '../../db/requests.ts';
import { ServiceError } from '../../core/errors.ts';
import { replay } from './streams.ts';
import { trackStream } from '../../metrics/metrics.ts';

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

export function recordJson(r: RecordRow): string {
  const head = JSON.stringify({
    request_id: r.id,
    status: r.status,
    dialect: r.dialect,
    streaming: r.streaming,
    backend_id: r.backend_id,
    attempts: r.attempts,
    recoveries: r.recoveries,
    next_retry_at: r.next_retry_at ? r.next_retry_at.toISOString() : null,
    attempt_log: r.attempt_log,
  });
  const tail: string[] = [];
  if (r.status === 'succeeded' && !r.streaming && r.response_body) {
    tail.push(`"response":${asObject(r.response_body, r.response_content_type)}`);
  }
  if (r.status === 'failed' && r.response_body) {
    tail.push(`"error":${asObject(r.response_body, r.response_content_type)}`);
    if (r.error_status !== null) tail.push(`"error_status":${r.error_status}`);
    // SPEC.md types retry_after as the provider's header verbatim: absent when it sent none.
    if (r.error_status !== null && r.retry_after !== null) tail.push(`"retry_after":${JSON.stringify(r.retry_after)}`);
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
    await trackStream('replay', () => replay(deps, req, res, { id: record.id, namespaceId: record.namespace_id, streaming: true }));
    return;
  }
  res.status(200).set('content-type', 'application/json').send(recordJson(record));
}
