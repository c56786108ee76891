// The accounts of a namespace (key with the manage grant): GET /requests (listing),
// GET /requests/{id}/summary (one listing row), GET /usage and GET /storage (docs/accounting.md
// "The listing", "A request's summary", "Usage" and "Storage").
import type { Request, Response, RequestHandler, Router } from 'express';
import type { Deps } from '../../deps.ts';
import { serviceAuth, serviceAuthOf } from '../service-auth.ts';
import { ServiceError } from '../../core/errors.ts';
import { encodeCursor, decodeCursor } from '../../core/cursor.ts';
import { parseListingFilter, cursorScope } from '../../core/listing-filter.ts';
import { parseLimit as parseVendorLimit } from '../../core/vendor-api.ts';
import { listRequests, findListingRow, namespaceTotals, usageByKey, type ListingRow } from '../../db/accounting.ts';
import { rateWindows, type RateWindow } from '../../db/rate-limits.ts';
import { batchStorage } from '../../db/files.ts';

export const DEFAULT_LIMIT = 50;
export const MAX_LIMIT = 200;
const DAY_MS = 86_400_000;

const iso = (date: Date | null) => (date ? date.toISOString() : null);

export function listingRow(row: ListingRow) {
  return {
    request_id: row.id,
    status: row.status,
    model: row.model,
    dialect: row.dialect,
    streaming: row.streaming,
    api_key_id: row.api_key_id,
    api_key_prefix: row.api_key_prefix,
    backend_id: row.backend_id,
    prompt_tokens: row.prompt_tokens,
    completion_tokens: row.completion_tokens,
    total_tokens: row.total_tokens,
    cost: row.cost_micros,
    stored_bytes: row.stored_bytes,
    attempts: row.attempts,
    recoveries: row.recoveries,
    created_at: iso(row.created_at),
    started_at: iso(row.started_at),
    finished_at: iso(row.finished_at),
    expired: row.expired,
    cached_from: row.cached_from,
    // A batch line's batch (docs/api.md "Batches"); absent from the export's rows.
    ...(row.batch_id === undefined ? {} : { batch_id: row.batch_id }),
  };
}

/** A limited key's limits and its current minute (docs/accounting.md "Usage"). */
export function rateLimitView(w: RateWindow) {
  return {
    api_key_id: w.api_key_id,
    requests_per_minute: w.requests_per_minute,
    tokens_per_minute: w.tokens_per_minute,
    window: { started_at: w.window_start.toISOString(), requests: w.requests, tokens: w.tokens, refused: w.refused },
  };
}

/** A single query parameter as a string; repeated parameters are malformed. */
function param(req: Request, name: string): string | undefined {
  const v = req.query[name];
  if (v === undefined) return undefined;
  if (typeof v !== 'string') throw new ServiceError('bad_request', `\`${name}\` must be given once.`);
  return v;
}

/** `limit` of Sarsen's own listings: 1 to 200, default 50. */
export const parseLimit = (value: string | undefined): number => parseVendorLimit(value, DEFAULT_LIMIT, MAX_LIMIT);

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
    const row = await findListingRow(deps.pool, scope.namespaceId(res), String(req.params.id));
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
    const [totals, keys, windows] = await Promise.all([
      namespaceTotals(deps.pool, auth.namespaceId),
      usageByKey(deps.pool, auth.namespaceId, new Date(since)),
      rateWindows(deps.pool, auth.namespaceId),
    ]);
    res.json({
      namespace_id: auth.namespaceId,
      itemised_since: since,
      accepted_submissions: totals.accepted_submissions,
      provider_calls: totals.provider_calls,
      upstream_sent_bytes: totals.upstream_sent_bytes,
      upstream_received_bytes: totals.upstream_received_bytes,
      cache_hits: totals.cache_hits,
      api_keys: keys,
      rate_limits: windows.map(rateLimitView),
    });
  });

  router.get(`${base}/storage`, ...guards, async (_req: Request, res: Response) => {
    const auth = { namespaceId: scope.namespaceId(res) };
    const [t, b] = await Promise.all([namespaceTotals(deps.pool, auth.namespaceId), batchStorage(deps.pool, auth.namespaceId)]);
    res.json({
      namespace_id: auth.namespaceId,
      // The contract's sum: what the namespace's requests hold (docs/accounting.md "Storage").
      stored_bytes: t.request_bytes + t.response_bytes + t.chunk_bytes,
      request_bytes: t.request_bytes,
      response_bytes: t.response_bytes,
      chunk_bytes: t.chunk_bytes,
      // Beside it, not in it: uploaded files, byte for byte, and the bodies of batch lines not yet
      // run (docs/api.md "Batches").
      file_bytes: b.file_bytes,
      batch_bytes: b.batch_bytes,
    });
  });
}
