// GET/PATCH /{tenancy}/v1/tenancy (owner): the tenancy's display name and retention horizon.
import { z } from 'zod';
import type { Router } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { findTenancy, updateTenancy, type TenancyRow } from '../../db/tenancies.ts';
import { effectiveRetentionMinutes } from '../../core/retention.ts';
import { consoleAuth, consoleOf } from './console-auth.ts';
import { readPayload, text, retentionMinutes, isoTime } from './validate.ts';

export const patchSchema = z.strictObject({
  display_name: text(200).optional(),
  retention_minutes: retentionMinutes.optional(),
});

export function tenancyView(deps: Deps, tenancy: TenancyRow) {
  return {
    tenancy_id: tenancy.id,
    slug: tenancy.slug,
    display_name: tenancy.display_name,
    retention_minutes: tenancy.retention_minutes,
    // What a namespace that names no horizon of its own gets.
    effective_retention_minutes: effectiveRetentionMinutes({
      namespaceMinutes: null,
      tenancyMinutes: tenancy.retention_minutes,
      metadataHorizonMinutes: deps.settings.current().metadata_horizon_minutes,
    }),
    created_at: isoTime(tenancy.created_at),
  };
}

export function tenancyRoutes(deps: Deps, router: Router): void {
  router.get('/:tenancy/v1/tenancy', consoleAuth(deps, 'owner'), async (_req, res) => {
    const tenancy = await findTenancy(deps.pool, consoleOf(res).user.tenancy_id);
    if (tenancy === null) throw new ServiceError('not_found');
    res.json(tenancyView(deps, tenancy));
  });
  router.patch('/:tenancy/v1/tenancy', consoleAuth(deps, 'owner'), async (req, res) => {
    const patch = await readPayload(req, patchSchema);
    const tenancy = await updateTenancy(deps.pool, consoleOf(res).user.tenancy_id, patch);
    if (tenancy === null) throw new ServiceError('not_found');
    res.json(tenancyView(deps, tenancy));
  });
}
