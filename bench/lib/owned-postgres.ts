// A PostgreSQL the capacity benchmark owns: embedded PostgreSQL (the binaries `npm start` runs),
// durable (fsync, synchronous_commit, full_page_writes at their defaults, on), with
// pg_stat_statements loaded so statements can be counted, and autovacuum off as on the machines
// docs/performance.md describes (a vacuum that starts mid-run is noise, not the request's cost).
// Its postmaster and every process it runs are pinned to the proxy's cores; backends it forks
// later inherit that. Nothing else uses it, so its whole CPU is the proxy's database's, and
// no other user's server has its affinity changed.
//
// The test harness (test/support/db.ts) is pointed at it through CTX_DATABASE_* and a secrets
// directory holding its password, so createTestDatabase and benchDatabase work as elsewhere.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import crypto from 'node:crypto';
import pg from 'pg';
import { startEmbedded, type EmbeddedServer } from '../../src/db/embedded.ts';
import type { ConnectionConfig } from '../../src/db/pool.ts';
import { pinTree } from './pin.ts';

export type OwnedPostgres = { conn: ConnectionConfig; postmaster: number; pinAgain(): void; stop(): Promise<void> };

async function admin(conn: ConnectionConfig, sql: string): Promise<void> {
  const client = new pg.Client(conn);
  client.on('error', () => undefined);
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

/** Starts it, pinned to `cpus`, and points the test harness at it; stop() removes it (and Ctrl-C does too). */
export async function startOwnedPostgres(cpus: string): Promise<OwnedPostgres> {
  const base = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-capacity-pg-'));
  const dir = path.join(base, 'pg');
  const password = crypto.randomBytes(16).toString('hex');
  let server: EmbeddedServer | null = null;
  const stop = async () => {
    await server?.stop().catch(() => undefined);
    server = null;
    fs.rmSync(base, { recursive: true, force: true });
  };
  const onSignal = (signal: NodeJS.Signals) => void stop().finally(() => process.exit(signal === 'SIGINT' ? 130 : 143));
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    // The first start creates the cluster; preloaded libraries take a restart.
    server = await startEmbedded({ dir, password });
    await admin(server.conn, `ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'`);
    await admin(server.conn, 'ALTER SYSTEM SET autovacuum = off');
    await server.stop();
    server = await startEmbedded({ dir, password });
    const postmaster = server.pid;
    if (postmaster === null) throw new Error('the benchmark\'s PostgreSQL has no postmaster of its own');
    pinTree(postmaster, cpus);
    await admin(server.conn, 'CREATE EXTENSION IF NOT EXISTS pg_stat_statements');
    const secrets = path.join(base, 'secrets');
    fs.mkdirSync(secrets, { mode: 0o700 });
    fs.writeFileSync(path.join(secrets, 'database-password'), password, { mode: 0o600 });
    Object.assign(process.env, {
      CTX_DATABASE_HOST: server.conn.host,
      CTX_DATABASE_PORT: String(server.conn.port),
      CTX_DATABASE_USER: server.conn.user,
      CTX_SECRETS_DIR: secrets,
    });
    return {
      conn: server.conn,
      postmaster,
      pinAgain: () => pinTree(postmaster, cpus),
      stop: async () => {
        process.off('SIGINT', onSignal);
        process.off('SIGTERM', onSignal);
        await stop();
      },
    };
  } catch (err) {
    await stop();
    throw err;
  }
}
