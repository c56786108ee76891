// A PostgreSQL server a test owns outright, to fault it: embedded PostgreSQL in a temporary
// directory on a fixed port, which the test can crash (SIGKILL of the postmaster), shut down in
// fast or immediate mode, start again on the same port, or turn into the standby of a primary
// that is gone and be promoted (a failover, seen from the standby). Durable settings: a crash must not
// take back a commit Sarsen already reported. Never the machine's shared server.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import crypto from 'node:crypto';
import pg from 'pg';
import { startEmbedded, ensureDatabase, freePort, type EmbeddedServer } from '../../src/db/embedded.ts';
import { createPool, type ConnectionConfig } from '../../src/db/pool.ts';
import { migrate } from '../../src/db/migrate.ts';
import type { Settings } from '../../src/config/settings.ts';
import { writeSettings, type TestDatabase } from './db.ts';
import { track } from './resources.ts';

export type Outage = 'crash' | 'fast' | 'immediate';

export type OwnedPostgres = {
  /** The maintenance database; the same address across restarts. */
  admin: ConnectionConfig;
  /** Takes the server down: SIGKILL of the postmaster, or a fast or immediate shutdown. */
  down(kind: Outage): Promise<void>;
  /** Starts it again on the same port and data (after a crash, once the orphaned backends are gone). */
  up(): Promise<void>;
  /** A migrated database on this server with the test settings and `settings`. */
  database(name: string, settings?: Partial<Settings>): Promise<TestDatabase>;
  /**
   * Restarts the server as a hot standby whose primary is gone: it answers reads, refuses writes
   * (SQLSTATE 25006) and reports in_hot_standby, until `promote`.
   */
  standby(): Promise<void>;
  /** Promotes the standby (pg_promote): resolves once it takes writes. */
  promote(): Promise<void>;
  /** Ends every connection to `database` but the caller's (pg_terminate_backend). */
  terminateBackends(database: string): Promise<number>;
  close(): Promise<void>;
};

const SIGNAL: Record<Outage, NodeJS.Signals> = { crash: 'SIGKILL', fast: 'SIGINT', immediate: 'SIGQUIT' };

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

export async function startOwnedPostgres(): Promise<OwnedPostgres> {
  const base = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-owned-pg-'));
  const dir = path.join(base, 'pg');
  const password = crypto.randomBytes(16).toString('hex');
  const port = await freePort();
  let server: EmbeddedServer | null = await startEmbedded({ dir, password, port });
  const release = track('owned postgres', dir);

  const up = async (): Promise<void> => {
    const deadline = Date.now() + 30_000;
    for (;;) {
      try {
        server = await startEmbedded({ dir, password, port });
        return;
      } catch (err) {
        // After a crash the old backends notice their postmaster's death within moments; until
        // then the new postmaster refuses the shared memory they still hold.
        if (Date.now() > deadline) throw err;
        await new Promise((r) => setTimeout(r, 200));
      }
    }
  };

  const down = async (kind: Outage): Promise<void> => {
    const pid = server?.pid;
    if (!pid) throw new Error('the owned PostgreSQL is not running');
    process.kill(pid, SIGNAL[kind]);
    while (alive(pid)) await new Promise((r) => setTimeout(r, 20));
    server = null;
  };

  return {
    admin: { host: '127.0.0.1', port, user: 'postgres', password, database: 'postgres' },
    down,
    up,
    async database(name, settings = {}) {
      const admin = { host: '127.0.0.1', port, user: 'postgres', password, database: 'postgres' };
      await ensureDatabase(admin, name);
      const conn = { ...admin, database: name };
      const pool = createPool(conn, { max: 2, name: 'sarsen-test-migrate' });
      try {
        await migrate(conn, pool);
      } finally {
        await pool.end();
      }
      await writeSettings(conn, settings);
      return { conn, name, drop: async () => {} }; // gone with the server
    },
    async standby() {
      await down('fast');
      // Standby mode with nothing to replay from: it recovers to its last checkpoint and waits there.
      const signal = path.join(dir, 'standby.signal');
      fs.writeFileSync(signal, '');
      const { uid, gid } = fs.statSync(dir);
      fs.chownSync(signal, uid, gid);
      await up();
    },
    async promote() {
      const client = new pg.Client({ host: '127.0.0.1', port, user: 'postgres', password, database: 'postgres' });
      client.on('error', () => undefined);
      await client.connect();
      try {
        const { rows } = await client.query<{ done: boolean }>('SELECT pg_promote(true, 60) AS done');
        if (!rows[0]?.done) throw new Error('the standby was not promoted within 60 s');
      } finally {
        await client.end();
      }
    },
    async terminateBackends(database) {
      const client = new pg.Client({ host: '127.0.0.1', port, user: 'postgres', password, database: 'postgres' });
      client.on('error', () => undefined);
      await client.connect();
      try {
        const { rowCount } = await client.query(
          'SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()',
          [database],
        );
        return rowCount ?? 0;
      } finally {
        await client.end();
      }
    },
    async close() {
      await server?.stop();
      server = null;
      fs.rmSync(base, { recursive: true, force: true });
      release();
    },
  };
}
