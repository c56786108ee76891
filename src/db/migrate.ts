// Schema migrations, applied at startup before the listener binds (docs/operations.md
// "Migrations"). Our own SQL files run through node-pg-migrate; graphile-worker installs its own
// schema after. Both run under one session advisory lock so processes starting together apply
// them once.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { runner } from 'node-pg-migrate';
import { runMigrations as runWorkerMigrations } from 'graphile-worker';
import type { ConnectionConfig, Pool } from './pool.ts';
import { createClient } from './pool.ts';
import { setClientDeadline } from './deadlines.ts';
import { logger } from '../log.ts';
import { workerLogger } from './worker-logger.ts';
import { ENSURE_TASK_SQL } from './jobs.ts';
import { ensurePartitions } from './partitions.ts';

export const MIGRATIONS_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../sql/migrations');

const MIGRATION_NAMES = fs
  .readdirSync(MIGRATIONS_DIR)
  .filter((f) => f.endsWith('.sql'))
  .map((f) => f.replace(/\.sql$/, ''));

// An arbitrary, fixed 64-bit key: "sarsen migrate".
const MIGRATION_LOCK_KEY = 0x5a7e_3100_0001n;
// What one statement of the migrations may take (rewriting a large table, or waiting for the lock
// while another process migrates): bounded like every round trip, far beyond any other
// (docs/operations.md "When the network goes silent").
const MIGRATION_DEADLINE_MS = 30 * 60_000;

export async function migrate(conn: ConnectionConfig, pool: Pool): Promise<void> {
  const client = createClient(conn, 'sarsen-migrate');
  setClientDeadline(client, MIGRATION_DEADLINE_MS);
  await client.connect();
  try {
    await client.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK_KEY.toString()]);
    try {
      await runner({
        dbClient: client,
        dir: MIGRATIONS_DIR,
        direction: 'up',
        migrationsSchema: 'sarsen',
        migrationsTable: 'migrations',
        createMigrationsSchema: true,
        checkOrder: true,
        singleTransaction: true,
        noLock: true, // we hold our own lock, which also covers graphile-worker's migrations
        log: (msg: string) => logger.debug('migration', { detail: msg }),
        logger: { debug: () => {}, info: () => {}, warn: (m: string) => logger.warn(m), error: (m: string) => logger.error(m) },
      });
      await runWorkerMigrations({ pgPool: pool, logger: workerLogger });
      await client.query(ENSURE_TASK_SQL);
      // Before anything is written: the partitions new rows go to (docs/storage.md).
      await ensurePartitions(pool);
    } finally {
      await client.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK_KEY.toString()]).catch(() => undefined);
    }
  } finally {
    await client.end();
  }
}

/** True when every migration file has been applied (readiness). */
export async function migrationsApplied(pool: Pool): Promise<boolean> {
  const { rows } = await pool.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM sarsen.migrations WHERE name = ANY($1::text[])`,
    [MIGRATION_NAMES],
  );
  return rows[0]?.n === MIGRATION_NAMES.length;
}

/**
 * Whether the database answers but Sarsen's schema is gone (dropped, or a database restored
 * without it): the one fault that waiting cannot heal. False while the database is unreachable.
 */
export async function schemaMissing(pool: Pool): Promise<boolean> {
  try {
    return !(await migrationsApplied(pool));
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    return code === '42P01' || code === '3F000'; // undefined_table, invalid_schema_name
  }
}
