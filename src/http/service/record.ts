// GET /requests/{id} as JSON (SPEC.md "Request record"): the JSON text is built around the
// stored answer bytes, so `response` is embedded exactly as stored, never re-serialised.
import type { RecordRow } from '../../db/requests.ts';

/** Whether `bytes` hold one JSON object (what `response` and `error` must be). */
function isJsonObjectText(bytes: Buffer): boolean {
  try {
    const v: unknown = JSON.parse(bytes.toString('utf8'));
    return v !== null && typeof v === 'object' && !Array.isArray(v);
  } catch {
    return false;
  }
}

/** A stored body that is not a JSON object (an HTML error page, say) is kept, as text, inside one. */
function asObject(bytes: Buffer): string {
  return isJsonObjectText(bytes) ? bytes.toString('utf8') : JSON.stringify({ body: bytes.toString('utf8') });
}

export function recordJson(r: RecordRow): string {
  const head = JSON.stringify({
    request_id: r.id,
    status: r.status,
    dialect: r.dialect,
    streaming: r.streaming,
    attempts: r.attempts,
    recoveries: r.recoveries,
    next_retry_at: r.next_retry_at ? r.next_retry_at.toISOString() : null,
  });
  const tail: string[] = [];
  if (r.status === 'succeeded' && !r.streaming && r.response_body) {
    tail.push(`"response":${asObject(r.response_body)}`);
  }
  if (r.status === 'failed' && r.response_body) {
    tail.push(`"error":${asObject(r.response_body)}`);
    if (r.error_status !== null) {
      tail.push(`"error_status":${r.error_status}`, `"retry_after":${JSON.stringify(r.retry_after)}`);
    }
  }
  return tail.length === 0 ? head : `${head.slice(0, -1)},${tail.join(',')}}`;
}
