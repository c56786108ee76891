// The plain `deps` object every factory takes (no dependency-injection framework), and the
// seams server.ts wires between the parts: acceptance (http/service/submitter.ts) and this
// process's executor (executor/attempt-runner.ts) know each other only through these types.
import type { ConnectionConfig, Pool } from './db/pool.ts';
import type { Bus } from './bus/bus.ts';
import type { SettingsCache } from './config/settings.ts';
import type { Secrets } from './config/secrets.ts';
import type { ServeOptions } from './config/config.ts';
import type { Keyring } from './core/sealing.ts';
import type { NewRequest, Submitted } from './db/submissions.ts';
import type { Attempt } from './db/attempts.ts';
import type { BackendForCall } from './db/backends.ts';

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

/** A submission as acceptance commits it. */
export type NewSubmission = Omit<NewRequest, 'owner' | 'precounted'> & {
  backend: BackendForCall;
  /**
   * A caller may be waiting on the answer (a synchronous or streaming submission, or a background
   * response, which its caller polls or resumes from the moment its create answers; not
   * POST /requests): the attempt starts at once instead of yielding to acceptance
   * (docs/durability.md "Acceptance first").
   */
  callerWaits: boolean;
};

/** Acceptance's group commit: answers the request the submission landed on. */
export type Submitter = { submit(submission: NewSubmission): Promise<Submitted>; close(): Promise<void> };

/**
 * The hand-off from acceptance to this process's executor (docs/durability.md "Run where
 * accepted"). Before its commit a submission asks for a slot: `reserve` answers the lease owner
 * its commit claims for, or null when no slot is free (the commit records and enqueues only).
 * After a commit told to claim, `start` runs the attempt it claimed in that slot, or, given
 * null (it claimed nothing, or failed), frees the slot.
 */
export type RunWhereAccepted = Readonly<{
  reserve(): string | null;
  start(claimed: Attempt | null, opts: { callerWaits: boolean }): void;
}>;
