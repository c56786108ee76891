// GET /{tenancy}/v1/billing and /billing/ledger (owner): balance, metering, ledger pages.
import type { Router } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { consoleAuth, consoleOf } from './console-auth.ts';
import { isoTime } from './validate.ts';
import { creditBalance, ledgerPage } from '../../db/accounting.ts';
import { encodeCursor, decodeCursor } from '../../core/cursor.ts';
import { parseLimit } from '../service/accounts.ts';

export function billingRoutes(deps: Deps, router: Router): void {
  router.get('/:tenancy/v1/billing', consoleAuth(deps, 'owner'), async (_req, res) => {
    const tenancyId = consoleOf(res).user.tenancy_id;
    res.json({
      tenancy_id: tenancyId,
      balance_micros: await creditBalance(deps.pool, tenancyId),
      metering_enabled: deps.settings.current().metering_enabled,
    });
  });
  router.get('/:tenancy/v1/billing/ledger', consoleAuth(deps, 'owner'), async (req, res) => {
    const tenancyId = consoleOf(res).user.tenancy_id;
    const limitText = req.query.limit;
    const afterText = req.query.after;
    if ((limitText !== undefined && typeof limitText !== 'string') || (afterText !== undefined && typeof afterText !== 'string')) {
      throw new ServiceError('bad_request', '`limit` and `after` must be given once each.');
    }
    const limit = parseLimit(limitText);
    let before: number | null = null;
    if (afterText !== undefined) {
      const position = decodeCursor(deps.secrets.apiKeyHashKey, tenancyId, afterText);
      if (position === null || !/^\d+$/.test(position)) throw new ServiceError('bad_request', '`after` is not a cursor this ledger gave out.');
      before = Number(position);
    }
    const rows = await ledgerPage(deps.pool, tenancyId, before, limit + 1);
    const page = rows.slice(0, limit);
    const last = page[page.length - 1];
    res.json({
      data: page.map((r) => ({
        entry_id: r.id,
        namespace_id: r.namespace_id,
        api_key_id: r.api_key_id,
        request_id: r.request_id,
        kind: r.kind,
        amount_micros: r.amount_micros,
        created_at: isoTime(r.created_at),
      })),
      next_after: rows.length > limit && last ? encodeCursor(deps.secrets.apiKeyHashKey, tenancyId, String(last.id)) : null,
    });
  });
}
