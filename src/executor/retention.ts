// The retention sweep (executor role, every `retention_sweep_interval_ms`; docs/storage.md).
// The watching executor runs the passes (the others' loops pass without a statement), and a
// pass runs under a session advisory lock, so two never overlap: it creates partitions
// ahead, drops the days of payloads whose every record is past its horizon (and the months of
// request rows and ledger past theirs), then sweeps row by row what the drops do not reach in
// time: the records of namespaces with a shorter horizon than the longest (src/core/partitions.ts
// rowSweep), lapsed idempotency claims, and the longer horizons' leftovers.
import { sweepBatchStorage } from '../db/files.ts';
import type { BaseDeps } from '../deps.ts';
import type { PoolClient } from '../db/pool.ts';
import { setClientDeadline } from '../db/deadlines.ts';
import { effectiveRetentionMinutes } from '../core/retention.ts';
import { rowSweep } from '../core/partitions.ts';
import { firstIdAt, idTime } from '../core/ids.ts';
import { lockRetentionPass, unlockRetentionPass, namespaceHorizons, sweepRecords, sweepLapsedClaims, sweepListingRows, sweepLedger } from '../db/retention.ts';
import {
  ensurePartitions, finishRetired, listPartitions, retiredBelow, retirePayloads, retireRequestRows, retireLedger, PAYLOADS, LEDGER, type Horizon,
} from '../db/partitions.ts';
import { logger, errorFields } from '../log.ts';
import { countExpired, countSweep } from '../metrics/metrics.ts';
import { startLoop, type Loop } from './loop.ts';
import { IDLE_SWEEP_MS } from './sweep.ts';

const BATCH = 500;
// One pass stops after this many batches of a kind so a huge backlog cannot starve the others;
// the next pass carries on.
const MAX_BATCHES = 200;
// Days of payloads one pass may drop (a deployment catching up after a pause drops a week a pass).
const MAX_DAYS = 7;
// What one statement of a pass may take: a batch of deletes over large stored bodies, a partition
// drop waiting for its lock, or (waiting for it) another process's whole pass; longer than any
// request's round trip, still bounded (docs/operations.md "When the network goes silent").
export const RETENTION_DEADLINE_MS = 300_000;

async function drain(fn: () => Promise<number>): Promise<number> {
  let total = 0;
  for (let i = 0; i < MAX_BATCHES; i++) {
    const n = await fn();
    total += n;
    if (n < BATCH) break;
  }
  return total;
}

export type RetentionCounts = { records: number; claims: number; listing: number; ledger: number; partitions: number };
const NOTHING: RetentionCounts = { records: 0, claims: 0, listing: 0, ledger: 0, partitions: 0 };

type Deps = Pick<BaseDeps, 'pool' | 'settings'>;

/**
 * One retention pass. `wait`: wait for a pass another process is running to end, then run
 * (tests, operators); otherwise skip when one is running (the executors' loop).
 */
export async function runRetentionSweep(deps: Deps, opts: { wait?: boolean } = {}): Promise<RetentionCounts> {
  const client = await deps.pool.connect();
  setClientDeadline(client, RETENTION_DEADLINE_MS);
  let failure: Error | undefined;
  let locked = false;
  try {
    locked = await lockRetentionPass(client, opts.wait !== false);
    if (!locked) return NOTHING;
    const counts = await pass(deps, client);
    if (counts.records + counts.listing + counts.ledger + counts.partitions > 0) logger.info('retention sweep', counts);
    countExpired(counts);
    return counts;
  } catch (err) {
    failure = err as Error;
    throw err;
  } finally {
    if (locked && !failure) await unlockRetentionPass(client).catch(() => undefined);
    setClientDeadline(client, null);
    // A failed pass's connection is closed, not reused: its lock and any session setting go with it.
    client.release(failure);
  }
}

async function pass(deps: Deps, db: PoolClient): Promise<RetentionCounts> {
  const s = deps.settings.current();
  const now = Date.now();
  await ensurePartitions(deps.pool, now);
  let partitions = await finishRetired(db);

  const horizons: Horizon[] = (await namespaceHorizons(db)).map((ns) => ({
    namespace_id: ns.namespace_id,
    minutes: effectiveRetentionMinutes({ namespaceMinutes: ns.namespace_minutes, tenancyMinutes: ns.tenancy_minutes, metadataHorizonMinutes: s.metadata_horizon_minutes }),
  }));
  partitions += await retirePayloads(db, horizons, s.metadata_horizon_minutes, MAX_DAYS, now);

  // The row sweep: each namespace's records the drops leave, then those of deleted namespaces.
  const from = await retiredBelow(db);
  const fromMs = from === '' ? null : idTime(from);
  const legacy = (await listPartitions(db, [...PAYLOADS.tables, ...LEDGER.tables])).filter((p) => p.loMs === null);
  const legacyPayloadsHi = legacy.find((p) => p.table === PAYLOADS.tables[0])?.hiMs ?? null;
  const longest = horizons.length === 0 ? s.metadata_horizon_minutes : Math.max(...horizons.map((h) => h.minutes));
  const sweep = async (namespaceId: string | null, minutes: number) => {
    const rule = rowSweep(minutes, longest, now, legacyPayloadsHi);
    const below = rule.everything ? null : firstIdAt('req', rule.belowMs);
    if (below !== null && below <= from) return 0;
    return drain(() => sweepRecords(db, namespaceId, minutes, BATCH, { from, fromMs, below }));
  };
  let records = 0;
  for (const h of horizons) records += await sweep(h.namespace_id, h.minutes);
  records += await sweep(null, s.metadata_horizon_minutes);
  // Batch files, and ended batches with their lines, by the same horizons (docs/api.md "Batches").
  for (const h of horizons) records += await drain(() => sweepBatchStorage(db, h.namespace_id, h.minutes, BATCH));

  const claims = await drain(() => sweepLapsedClaims(db, BATCH));
  const listing = await drain(() => sweepListingRows(db, s.listing_horizon_days, BATCH));
  const legacyLedger = legacy.find((p) => p.table === LEDGER.tables[0]);
  const ledger = await drain(() => sweepLedger(db, s.ledger_horizon_days, BATCH, legacyLedger?.name ?? null));
  partitions += await retireRequestRows(db, s.listing_horizon_days, now);
  partitions += await retireLedger(db, s.ledger_horizon_days, now);
  return { records, claims, listing, ledger, partitions };
}

/**
 * The retention loop: every executor runs it, the watching one (`watches`) sweeps (one sweeper
 * does a sweep). While the deployment is idle (not `busy`) nothing new is stored, what ages past
 * its horizon can wait a few minutes, and a pass runs at most every IDLE_SWEEP_MS
 * (docs/scaling.md "An idle process").
 */
export function startRetentionSweeper(deps: BaseDeps, opts: { watches: () => boolean; busy: () => boolean }): Loop {
  const { watches, busy } = opts;
  const every = () => deps.settings.current().retention_sweep_interval_ms;
  const pause = () => (busy() ? every() : Math.max(every(), IDLE_SWEEP_MS));
  return startLoop(
    async () => {
      if (!watches()) return pause();
      await runRetentionSweep(deps, { wait: false });
      countSweep('retention', true);
      return pause();
    },
    {
      firstDelayMs: pause(),
      failed: (err) => {
        countSweep('retention', false);
        logger.warn('retention sweep failed; will try again', errorFields(err));
        return pause();
      },
    },
  );
}
