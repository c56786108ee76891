// The accounts of a namespace (key with the manage grant): GET /requests (listing),
// GET /requests/{id}/summary (one listing row), GET /usage and GET /storage (SPEC.md "Listing row", "Usage object", "Storage object").
import type { Request, Response, RequestHandler, Router } from 'express';
import type { Deps } from '../../deps.ts';
import { serviceAuth, serviceAuthOf } from '../service-auth.ts';
import { ServiceError } from '../../core/errors.ts';
import { encodeCursor, decodeCursor } from '../../core/cursor.ts';
import { parseListingFilter, cursorScope } from '../../core/listing-filter.ts';
import { listRequests, listingRow as readListingRow, namespaceTotals, usageByKey, type ListingRow } from '../../db/accounting.ts';

export const DEFAULT_LIMIT = 50;
export const MAX_LIMIT = 200;
const DAY_MS = 86_400_000;

const iso = (d: Date | null) => (d ? d.toISOString() : null);

export function listingRow(r: ListingRow) {
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

/**
 * Where a namespace's routes live and who may call them: the service routes (an API key with
 * the manage grant) and the administration routes (a console session) share the handlers.
 */
export type NamespaceScope = { base: string; guards: RequestHandler[]; namespaceId(res: Response): string };

export const keyScope = (deps: Deps, base: string): NamespaceScope => ({
  base,
  guards: [serviceAuth(deps, 'manage')],
  namespaceId: (res) => serviceAuthOf(res).namespaceId,
});

export function accountRoutes(deps: Deps, router: Router, scope: NamespaceScope): void {
  const { base, guards } = scope;
  const cursorKey = deps.secrets.apiKeyHashKey;

  router.get(`${base}/requests`, ...guards, async (req: Request, res: Response) => {
    const namespaceId = scope.namespaceId(res);
    const limit = parseLimit(param(req, 'limit'));
    const filter = parseListingFilter((name) => param(req, name));
    const scoped = cursorScope(namespaceId, filter);
    const after = param(req, 'after');
    let before: string | null = null;
    if (after !== undefined) {
      before = decodeCursor(cursorKey, scoped, after);
      if (before === null) throw new ServiceError('bad_request', '`after` is not a cursor this listing (with these filters) gave out.');
    }
    const rows = await listRequests(deps.pool, namespaceId, before, limit + 1, filter);
    const page = rows.slice(0, limit);
    const last = page[page.length - 1];
    res.json({
      data: page.map(listingRow),
      next_after: rows.length > limit && last ? encodeCursor(cursorKey, scoped, last.id) : null,
    });
  });

  // One request's listing row by id: what a link to a request shows, swept or not.
  router.get(`${base}/requests/:id/summary`, ...guards, async (req: Request, res: Response) => {
    const row = await readListingRow(deps.pool, scope.namespaceId(res), String(req.params.id));
    if (!row) throw new ServiceError('not_found', 'No such request in this namespace.');
    res.json(listingRow(row));
  });

  router.get(`${base}/usage`, ...guards, async (req: Request, res: Response) => {
    const auth = { namespaceId: scope.namespaceId(res) };
    const sinceText = param(req, 'since');
    let since = Date.now() - 30 * DAY_MS;
    if (sinceText !== undefined) {
      if (!/^\d{1,15}$/.test(sinceText)) throw new ServiceError('bad_request', '`since` must be epoch milliseconds (a non-negative integer).');
      since = Number(sinceText);
    }
    // The window starts exactly at `since`, to the millisecond, and `itemised_since` echoes it.
    const [totals, keys] = await Promise.all([namespaceTotals(deps.pool, auth.namespaceId), usageByKey(deps.pool, auth.namespaceId, new Date(since))]);
    res.json({
      namespace_id: auth.namespaceId,
      itemised_since: since,
      accepted_submissions: totals.accepted_submissions,
      provider_calls: totals.provider_calls,
      upstream_sent_bytes: totals.upstream_sent_bytes,
      upstream_received_bytes: totals.upstream_received_bytes,
      api_keys: keys,
    });
  });

  router.get(`${base}/storage`, ...guards, async (_req: Request, res: Response) => {
    const auth = { namespaceId: scope.namespaceId(res) };
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
