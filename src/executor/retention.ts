// The retention sweep (executor role, every `retention_sweep_interval_ms`): each namespace's
// effective horizon (src/core/retention.ts, the same figure the admin routes show), then the
// longer horizons of listing metadata and the ledger, and lapsed idempotency claims.
import type { BaseDeps } from '../deps.ts';
import { effectiveRetentionMinutes } from '../core/retention.ts';
import { namespaceHorizons, sweepRecords, sweepLapsedClaims, sweepListingRows, sweepLedger } from '../db/retention.ts';
import { logger, errorFields } from '../log.ts';
import { countExpired, countSweep } from '../metrics/metrics.ts';

const BATCH = 500;
// One pass stops after this many batches of a kind so a huge backlog cannot starve the others;
// the next pass carries on.
const MAX_BATCHES = 200;

async function drain(fn: () => Promise<number>): Promise<number> {
  let total = 0;
  for (let i = 0; i < MAX_BATCHES; i++) {
    const n = await fn();
    total += n;
    if (n < BATCH) break;
  }
  return total;
}

export type RetentionCounts = { records: number; claims: number; listing: number; ledger: number };

export async function runRetentionSweep(deps: Pick<BaseDeps, 'pool' | 'settings'>): Promise<RetentionCounts> {
  const s = deps.settings.current();
  let records = 0;
  for (const ns of await namespaceHorizons(deps.pool)) {
    const minutes = effectiveRetentionMinutes({
      namespaceMinutes: ns.namespace_minutes,
      tenancyMinutes: ns.tenancy_minutes,
      metadataHorizonMinutes: s.metadata_horizon_minutes,
    });
    records += await drain(() => sweepRecords(deps.pool, ns.namespace_id, minutes, BATCH));
  }
  records += await drain(() => sweepRecords(deps.pool, null, s.metadata_horizon_minutes, BATCH));
  const claims = await drain(() => sweepLapsedClaims(deps.pool, BATCH));
  const listing = await drain(() => sweepListingRows(deps.pool, s.listing_horizon_days, BATCH));
  const ledger = await drain(() => sweepLedger(deps.pool, s.ledger_horizon_days, BATCH));
  if (records + listing + ledger > 0) logger.info('retention sweep', { records, claims, listing, ledger });
  countExpired({ records, claims, listing, ledger });
  return { records, claims, listing, ledger };
}

export function startRetentionSweeper(deps: BaseDeps): { stop(): Promise<void> } {
  let stopped = false;
  let timer: NodeJS.Timeout | null = null;
  let running: Promise<unknown> | null = null;
  const schedule = () => {
    if (!stopped) timer = setTimeout(tick, deps.settings.current().retention_sweep_interval_ms);
  };
  const tick = () => {
    timer = null;
    running = runRetentionSweep(deps)
      .then(() => countSweep('retention', true))
      .catch((err) => {
        countSweep('retention', false);
        logger.warn('retention sweep failed; will try again', errorFields(err));
      })
      .finally(() => {
        running = null;
        schedule();
      });
  };
  schedule();
  return {
    async stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      await running;
    },
  };
}
