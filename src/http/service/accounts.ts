// The accounts of a namespace (key with the manage grant): GET /requests (listing),
// GET /usage and GET /storage (SPEC.md "Listing row", "Usage object", "Storage object").
import type { Request, Router } from 'express';
import type { Deps } from '../../deps.ts';
import { serviceAuth, serviceAuthOf } from '../service-auth.ts';
import { ServiceError } from '../../core/errors.ts';
import { encodeCursor, decodeCursor } from '../../core/cursor.ts';
import { listRequests, namespaceTotals, usageByKey, type ListingRow } from '../../db/accounting.ts';

export const DEFAULT_LIMIT = 50;
export const MAX_LIMIT = 200;
const HOUR_MS = 3_600_000;
const DAY_MS = 24 * HOUR_MS;

const iso = (d: Date | null) => (d ? d.toISOString() : null);

function listingRow(r: ListingRow) {
  return {
    request_id: r.id,
    status: r.status,
    model: r.model,
    dialect: r.dialect,
    streaming: r.streaming,
    api_key_id: r.api_key_id,
    api_key_prefix: r.api_key_prefix,
    backend_id: r.backend_id,
    prompt_tokens: r.prompt_tokens,
    completion_tokens: r.completion_tokens,
    total_tokens: r.total_tokens,
    cost: r.cost_micros,
    stored_bytes: r.stored_bytes,
    attempts: r.attempts,
    recoveries: r.recoveries,
    created_at: iso(r.created_at),
    started_at: iso(r.started_at),
    finished_at: iso(r.finished_at),
    expired: r.expired,
  };
}

/** A single query parameter as a string; repeated parameters are malformed. */
function param(req: Request, name: string): string | undefined {
  const v = req.query[name];
  if (v === undefined) return undefined;
  if (typeof v !== 'string') throw new ServiceError('bad_request', `\`${name}\` must be given once.`);
  return v;
}

/** `limit`: 1 to 200, default 50; anything else is refused, never clamped. */
export function parseLimit(value: string | undefined): number {
  if (value === undefined) return DEFAULT_LIMIT;
  const n = /^\d{1,4}$/.test(value) ? Number(value) : NaN;
  if (!Number.isInteger(n) || n < 1 || n > MAX_LIMIT) {
    throw new ServiceError('bad_request', `\`limit\` must be an integer from 1 to ${MAX_LIMIT}.`);
  }
  return n;
}

export function accountRoutes(deps: Deps, router: Router, base: string): void {
  const manage = serviceAuth(deps, 'manage');
  const cursorKey = deps.secrets.apiKeyHashKey;

  router.get(`${base}/requests`, manage, async (req, res) => {
    const auth = serviceAuthOf(res);
    const limit = parseLimit(param(req, 'limit'));
    const after = param(req, 'after');
    let before: string | null = null;
    if (after !== undefined) {
      before = decodeCursor(cursorKey, auth.namespaceId, after);
      if (before === null) throw new ServiceError('bad_request', '`after` is not a cursor this listing gave out.');
    }
    const rows = await listRequests(deps.pool, auth.namespaceId, before, limit + 1);
    const page = rows.slice(0, limit);
    const last = page[page.length - 1];
    res.json({
      data: page.map(listingRow),
      next_after: rows.length > limit && last ? encodeCursor(cursorKey, auth.namespaceId, last.id) : null,
    });
  });

  router.get(`${base}/usage`, manage, async (req, res) => {
    const auth = serviceAuthOf(res);
    const sinceText = param(req, 'since');
    let since = Date.now() - 30 * DAY_MS;
    if (sinceText !== undefined) {
      if (!/^\d{1,15}$/.test(sinceText)) throw new ServiceError('bad_request', '`since` must be epoch milliseconds (a non-negative integer).');
      since = Number(sinceText);
    }
    // The itemisation is kept by the hour: the window starts at the hour `since` falls in,
    // and `itemised_since` says so.
    const windowStart = Math.floor(since / HOUR_MS) * HOUR_MS;
    const [totals, keys] = await Promise.all([namespaceTotals(deps.pool, auth.namespaceId), usageByKey(deps.pool, auth.namespaceId, new Date(windowStart))]);
    res.json({
      namespace_id: auth.namespaceId,
      itemised_since: windowStart,
      accepted_submissions: totals.accepted_submissions,
      provider_calls: totals.provider_calls,
      upstream_sent_bytes: totals.upstream_sent_bytes,
      upstream_received_bytes: totals.upstream_received_bytes,
      api_keys: keys,
    });
  });

  router.get(`${base}/storage`, manage, async (_req, res) => {
    const auth = serviceAuthOf(res);
    const t = await namespaceTotals(deps.pool, auth.namespaceId);
    res.json({
      namespace_id: auth.namespaceId,
      stored_bytes: t.request_bytes + t.response_bytes + t.chunk_bytes,
      request_bytes: t.request_bytes,
      response_bytes: t.response_bytes,
      chunk_bytes: t.chunk_bytes,
    });
  });
}
