// The plain `deps` object every factory takes (no dependency-injection framework).
import type { ConnectionConfig, Pool } from './db/pool.ts';
import type { Bus } from './bus/bus.ts';
import type { SettingsCache } from './config/settings.ts';
import type { Secrets } from './config/secrets.ts';
import type { ServeOptions } from './config/config.ts';
import type { Keyring } from './core/sealing.ts';
import type { Submitter } from './http/service/submitter.ts';

/** What every part of a process is built with. */
export type BaseDeps = Readonly<{
  /** Names this process: its leases' owner, and the origin of the events it NOTIFYs. */
  processId: string;
  /** Where the database is, for parts that keep connections of their own (the batch writers). */
  conn: ConnectionConfig;
  pool: Pool;
  bus: Bus;
  settings: SettingsCache;
  secrets: Secrets;
  serve: ServeOptions;
  /** Seals provider credentials at rest (credential-key, version 1). */
  keyring: Keyring;
}>;

/** The API role's: it also accepts submissions (group-committed; claimed here when this process executes too). */
export type Deps = BaseDeps & Readonly<{ submitter: Submitter }>;
