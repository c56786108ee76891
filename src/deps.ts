// The plain `deps` object every factory takes (no dependency-injection framework).
import type { Pool } from './db/pool.ts';
import type { Bus } from './bus/bus.ts';
import type { SettingsCache } from './config/settings.ts';
import type { Secrets } from './config/secrets.ts';
import type { ServeOptions } from './config/config.ts';
import type { Keyring } from './core/sealing.ts';

export type Deps = Readonly<{
  pool: Pool;
  bus: Bus;
  settings: SettingsCache;
  secrets: Secrets;
  serve: ServeOptions;
  /** Seals provider credentials at rest (credential-key, version 1). */
  keyring: Keyring;
}>;
