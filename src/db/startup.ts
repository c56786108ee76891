// How a process starts while its database may be failing over (docs/scaling.md "Starting during
// a failover"). With no host taking writes, it waits for one, whether it was given one host or
// several, instead of exiting into its deployment's restart loop. A standby that already holds
// the current schema lets it bind meanwhile (alive, not ready, writing nothing); a standby
// without it does not, since nothing binds before the schema is at the version this code
// expects (docs/operations.md "Migrations"). Every wait ends once a host takes writes.
import { setTimeout as sleep } from 'node:timers/promises';
import { formatHost, parseHosts, type HostPort } from '../core/hosts.ts';
import { logger } from '../log.ts';
import { createPool, isConnectionLoss, type ConnectionConfig, type Pool } from './pool.ts';
import { STANDBYS_ONLY, surveyHosts } from './writable-host.ts';
import { migrate, migrationsApplied } from './migrate.ts';

/** Where a starting process stands: a host takes writes, or a standby answers with the schema current. */
export type StartingPoint = 'writable' | 'standby';

// SQLSTATE classes a live server answers a connection it will not take with (a bad password or
// role, a database that does not exist): waiting does not heal them.
const REFUSED = /^(28|3D000$)/;

/** Resolves once a host takes writes, or a standby answers with the schema current, and says which. */
export function startingPoint(conn: ConnectionConfig): Promise<StartingPoint> {
  return waitFor(conn, true);
}

/** Resolves once a host takes writes. */
export async function writableHost(conn: ConnectionConfig): Promise<void> {
  await waitFor(conn, false);
}

/**
 * Applies the migrations once a host takes writes. A primary lost meanwhile (the write refused
 * as read-only, the connection gone) is waited for again: every migration step is repeatable.
 */
export async function migrateWhenWritable(conn: ConnectionConfig, pool: Pool): Promise<void> {
  for (;;) {
    await writableHost(conn);
    try {
      await migrate(conn, pool);
      return;
    } catch (err) {
      if (!isConnectionLoss(err)) throw err;
      await sleep(500);
    }
  }
}

async function waitFor(conn: ConnectionConfig, standbyWillDo: boolean): Promise<StartingPoint> {
  const hosts = parseHosts(conn.host, conn.port).map(formatHost).join(',');
  let said: string | null = null;
  for (let delay = 100; ; delay = Math.min(delay * 2, 1000)) {
    const found = await surveyHosts(conn);
    if (found.some((p) => p.state === 'writable')) {
      if (said) logger.info('a writable primary answers; starting', { hosts });
      return 'writable';
    }
    for (const p of found) if (p.state === 'unreachable' && REFUSED.test(String((p.err as { code?: unknown } | null)?.code))) throw p.err;
    const standby = found.find((p) => p.state === 'read-only')?.host;
    if (standby && standbyWillDo && (await schemaCurrentOn(conn, standby))) return 'standby';
    const line = standby ? STANDBYS_ONLY : 'no database host answers; waiting for one';
    if (said !== line) logger.warn(line, { hosts });
    said = line;
    await sleep(delay);
  }
}

/** Whether every migration is applied, as a standby (read-only) shows it; false if it cannot say. */
async function schemaCurrentOn(conn: ConnectionConfig, h: HostPort): Promise<boolean> {
  const pool = createPool({ ...conn, host: h.host, port: h.port }, { max: 1, name: 'sarsen-probe' });
  try {
    return await migrationsApplied(pool);
  } catch {
    return false;
  } finally {
    await pool.end();
  }
}
