// Settings: every figure the deployment charges or enforces, stored in sarsen.settings
// (defaults seeded by migration). This module validates them and keeps one cached snapshot per
// process, refreshed whenever the bus says a setting changed.
import { z } from 'zod';
import type { Pool } from '../db/pool.ts';
import { loadSettings, storeSetting } from '../db/settings.ts';
import type { Bus } from '../bus/bus.ts';
import { logger, errorFields } from '../log.ts';

const ms = (min: number, max: number) => z.number().int().min(min).max(max);
const DAY_MS = 86_400_000;

export const SETTING_SCHEMAS = {
  synchronous_hold_ms: ms(1, DAY_MS),
  idempotency_window_ms: ms(1, 7 * DAY_MS),
  lease_ms: ms(100, DAY_MS),
  heartbeat_ms: ms(10, DAY_MS),
  sweep_interval_ms: ms(10, DAY_MS),
  liveness_check_ms: ms(10, DAY_MS),
  retention_sweep_interval_ms: ms(10, DAY_MS),
  max_attempts: z.number().int().min(1).max(100),
  retry_base_ms: ms(0, DAY_MS),
  retry_max_ms: ms(0, DAY_MS),
  shutdown_grace_ms: ms(0, DAY_MS),
  backends_public_only: z.boolean(),
  upstream_connect_timeout_ms: ms(1, DAY_MS),
  upstream_headers_timeout_ms: ms(1, DAY_MS),
  upstream_idle_timeout_ms: ms(1, DAY_MS),
  database_deadline_ms: ms(100, DAY_MS),
  metadata_horizon_minutes: z.number().int().min(1).max(100 * 366 * 1440),
  listing_horizon_days: z.number().int().min(1).max(100 * 366),
  ledger_horizon_days: z.number().int().min(1).max(100 * 366),
  reroute_ceiling: z.number().int().min(1).max(1000),
  metering_enabled: z.boolean(),
  request_fee_micros: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
  sign_in_failures_per_account_address: z.number().int().min(1).max(1_000_000),
  sign_in_failures_per_account: z.number().int().min(1).max(1_000_000_000),
  sign_in_failures_per_address: z.number().int().min(1).max(1_000_000_000),
  sign_in_window_ms: ms(1000, 7 * DAY_MS),
  trusted_proxy_hops: z.number().int().min(0).max(16),
  // Batches (docs/api.md "Batches").
  batch_file_max_bytes: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER),
  batch_max_lines: z.number().int().min(1).max(10_000_000),
  message_batch_max_bytes: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER),
  batch_lines_in_flight: z.number().int().min(1).max(100_000),
  message_batch_window_ms: ms(1000, DAY_MS),
} as const;

export type SettingName = keyof typeof SETTING_SCHEMAS;
export type Settings = Readonly<{ [K in SettingName]: z.infer<(typeof SETTING_SCHEMAS)[K]> }>;

const settingsSchema = z.object(SETTING_SCHEMAS).strict();
// Cross-setting rules: a heartbeat must come well inside the lease it renews.
const consistent = settingsSchema.refine((s) => s.heartbeat_ms * 2 <= s.lease_ms, {
  message: 'heartbeat_ms must be at most half of lease_ms',
});

export class SettingError extends Error {
  override name = 'SettingError';
}

export function isSettingName(name: string): name is SettingName {
  return Object.hasOwn(SETTING_SCHEMAS, name);
}

export function parseSettings(raw: Record<string, unknown>): Settings {
  const parsed = consistent.safeParse(raw);
  if (!parsed.success) {
    throw new SettingError(parsed.error.issues.map((i) => `${i.path.join('.') || 'settings'}: ${i.message}`).join('; '));
  }
  return Object.freeze(parsed.data);
}

/** Parses a command-line value ("30000", "true") for one setting and validates it. */
function parseSettingValue(name: string, text: string): Settings[SettingName] {
  if (!isSettingName(name)) throw new SettingError(`Unknown setting ${JSON.stringify(name)}. Known: ${Object.keys(SETTING_SCHEMAS).join(', ')}`);
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new SettingError(`${name}: ${JSON.stringify(text)} is not a number or boolean`);
  }
  const parsed = SETTING_SCHEMAS[name].safeParse(value);
  if (!parsed.success) throw new SettingError(`${name}: ${parsed.error.issues.map((i) => i.message).join('; ')}`);
  return parsed.data;
}

/** Validates against the other stored settings too, then stores. */
export async function setSetting(pool: Pool, name: string, text: string): Promise<Settings[SettingName]> {
  const value = parseSettingValue(name, text);
  parseSettings({ ...(await loadSettings(pool)), [name]: value });
  await storeSetting(pool, name, value);
  return value;
}

export type SettingsCache = {
  current(): Settings;
  refresh(): Promise<void>;
  close(): void;
};

export async function createSettingsCache(pool: Pool, bus: Bus): Promise<SettingsCache> {
  let snapshot = parseSettings(await loadSettings(pool));
  // A change that lands while a read is in flight may be missed by that read: read again.
  let inFlight: Promise<void> | null = null;
  let dirty = false;
  const refresh = (): Promise<void> => {
    dirty = true;
    inFlight ??= (async () => {
      while (dirty) {
        dirty = false;
        try {
          snapshot = parseSettings(await loadSettings(pool));
        } catch (err) {
          // Keep serving the last good snapshot; a bad row is an operator error to fix.
          logger.error('settings refresh failed; keeping the previous values', errorFields(err));
        }
      }
      inFlight = null;
    })();
    return inFlight;
  };
  const unsubscribe = bus.subscribe('settings', () => void refresh());
  // NOTIFY is not replayed: after a reconnect, re-read in case we missed a change.
  const unReconnect = bus.onReconnect(() => void refresh());
  return {
    current: () => snapshot,
    refresh,
    close: () => {
      unsubscribe();
      unReconnect();
    },
  };
}
