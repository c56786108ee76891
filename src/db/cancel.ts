// An explicit cancel (issue 18). A pending request is finished here, through the same terminal
// write as an attempt's (accounting, the claim released, the credential destroyed, its event);
// a running one is marked, and the process holding its attempt aborts the provider call when
// it hears the `cancel` event or finds the mark at its next lease renewal.
import type { Pool } from './pool.ts';
import { withTransaction } from './pool.ts';
import type { Answer, RequestStatus } from './requests.ts';
import { settleBatch } from './attempts.ts';
import { notifyEvents } from './events.ts';
import { errorBody, ERROR_CODES } from '../core/errors.ts';

/** The stored error of a cancelled request: our own envelope, no provider status. */
export function cancelledAnswer(): Answer {
  return {
    status: 'failed',
    httpStatus: ERROR_CODES.cancelled.status,
    contentType: 'application/json',
    body: Buffer.from(errorBody('cancelled', ERROR_CODES.cancelled.message)),
    errorStatus: null,
    retryAfter: null,
  };
}

export type CancelResult =
  /** Finished now (it was pending: `answer` is its stored error), or earlier by a cancel. */
  | { kind: 'cancelled'; answer?: Answer }
  /** Marked: the process running its attempt stops it. */
  | { kind: 'cancelling' }
  /** It had already ended otherwise. */
  | { kind: 'finished'; status: RequestStatus };

/** Cancels a request of this namespace; null when the id is not this namespace's. */
export async function cancelRequest(
  pool: Pool,
  namespaceId: string,
  id: string,
  opts: { metering: boolean; origin: string },
): Promise<CancelResult | null> {
  return withTransaction(pool, async (c) => {
    const { rows } = await c.query<{ status: RequestStatus; cancel_requested: boolean; attempts: number; upstream_model: string }>(
      `SELECT status, cancel_requested, attempts, upstream_model FROM sarsen.requests WHERE id = $1 AND namespace_id = $2 FOR UPDATE`,
      [id, namespaceId],
    );
    const r = rows[0];
    if (!r) return null;
    if (r.status === 'failed' && r.cancel_requested) return { kind: 'cancelled' };
    if (r.status === 'succeeded' || r.status === 'failed') return { kind: 'finished', status: r.status };
    // Running: marked, and told again on every cancel (one event may have been lost).
    if (r.status === 'running') {
      await c.query(
        `WITH marked AS (UPDATE sarsen.requests SET cancel_requested = true WHERE id = $1 RETURNING id)
         , n AS (${notifyEvents(`SELECT id AS request_id, 'cancel' AS event, '' AS arg FROM marked`, '$2')})
         SELECT count(*) FROM n`,
        [id, opts.origin],
      );
      return { kind: 'cancelling' };
    }
    // Pending (new, or waiting for a retry, marked or not): the row lock keeps a claim out; it is settled as
    // a running attempt under its current number would be, so it ends as every failure does.
    await c.query(`UPDATE sarsen.requests SET status = 'running', cancel_requested = true WHERE id = $1`, [id]);
    const nulls = { prompt: null, completion: null, total: null };
    const answer = cancelledAnswer();
    // (ownCredential: whatever the request brought is destroyed; nothing is, if it brought none.)
    const terminal = {
      id, attempt: r.attempts, model: r.upstream_model, answer, tokens: nulls, frames: null, reached: false, sentBytes: 0, receivedBytes: 0, cancelled: true,
      end: { status: null, retryAfter: null, error: null }, ownCredential: true, tokenLimited: false, cacheable: false,
    };
    await settleBatch(c, [terminal], opts);
    return { kind: 'cancelled', answer };
  });
}
