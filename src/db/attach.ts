// Finding the live execution an identical body would attach to, without submitting anything
// (docs/api.md "Attach only"): how a client that lost its connection before the answer began
// finds its request again, with no chance of starting a second provider call.
import type { Pool } from './pool.ts';
import type { RequestStatus } from './requests.ts';

/** The request holding the live idempotency claim of `identity` in the namespace, or null. */
export async function liveClaim(pool: Pool, namespaceId: string, identity: Buffer): Promise<{ requestId: string; status: RequestStatus } | null> {
  const { rows } = await pool.query<{ id: string; status: RequestStatus }>(
    `SELECT q.id, q.status FROM sarsen.idempotency_claims k JOIN sarsen.requests q ON q.id = k.request_id
      WHERE k.namespace_id = $1 AND k.identity = $2 AND k.expires_at > now()`,
    [namespaceId, identity],
  );
  const r = rows[0];
  return r ? { requestId: r.id, status: r.status } : null;
}
