// Test databases. The server is the one CTX_DATABASE_* names when it answers (CI has a local
// PostgreSQL); otherwise embedded PostgreSQL on a free port in a temporary directory; a
// testcontainers PostgreSQL only when SARSEN_TEST_CONTAINERS=1 and a Docker engine exists.
// A migrated template database is made once per run and cloned for each suite. A database
// that cannot be had FAILS the run: nothing is skipped.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import crypto from 'node:crypto';
import pg from 'pg';
import type { ConnectionConfig } from '../../src/db/pool.ts';
import { createPool } from '../../src/db/pool.ts';
import { migrate } from '../../src/db/migrate.ts';
import { startEmbedded } from '../../src/db/embedded.ts';
import type { SettingName, Settings } from '../../src/config/settings.ts';
import { track } from './resources.ts';

type DbServer = { admin: ConnectionConfig; kind: string; stop(): Promise<void> };

let serverPromise: Promise<DbServer> | null = null;
let templatePromise: Promise<string> | null = null;
let cloneChain: Promise<unknown> = Promise.resolve();
const RUN = `${process.pid}_${crypto.randomBytes(3).toString('hex')}`;

async function answers(conn: ConnectionConfig): Promise<boolean> {
  const client = new pg.Client({ ...conn, connectionTimeoutMillis: 3000 });
  client.on('error', () => undefined);
  try {
    await client.connect();
    await client.query('SELECT 1');
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => undefined);
  }
}

function envServer(): ConnectionConfig | null {
  const host = process.env.CTX_DATABASE_HOST;
  if (!host) return null;
  let password: string | undefined;
  const dir = process.env.CTX_SECRETS_DIR;
  if (dir && fs.existsSync(path.join(dir, 'database-password'))) {
    password = fs.readFileSync(path.join(dir, 'database-password'), 'utf8').replace(/\r?\n$/, '');
  }
  return {
    host,
    port: Number(process.env.CTX_DATABASE_PORT ?? 5432),
    user: process.env.CTX_DATABASE_USER ?? 'postgres',
    database: 'postgres',
    password,
  };
}

async function containerServer(): Promise<DbServer> {
  const { GenericContainer, Wait } = await import('testcontainers');
  const container = await new GenericContainer('postgres:17')
    .withEnvironment({ POSTGRES_HOST_AUTH_METHOD: 'trust' })
    .withExposedPorts(5432)
    .withWaitStrategy(Wait.forLogMessage(/database system is ready to accept connections/, 2))
    .start();
  const admin = { host: container.getHost(), port: container.getMappedPort(5432), user: 'postgres', database: 'postgres' };
  return { admin, kind: 'testcontainers', stop: async () => void (await container.stop()) };
}

// Tests run embedded PostgreSQL without fsync; benchmarks ask for a durable one (see useDurableDatabase).
let durable = false;

/** Makes an embedded server started from here on durable (fsync, synchronous_commit, full_page_writes on). */
export function useDurableDatabase(): void {
  durable = true;
}

async function embeddedServer(): Promise<DbServer> {
  const base = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-test-'));
  const dir = path.join(base, 'pg');
  const password = crypto.randomBytes(16).toString('hex');
  const server = await startEmbedded({ dir, password, fast: !durable });
  return {
    admin: server.conn,
    kind: durable ? 'embedded (durable)' : 'embedded',
    stop: async () => {
      await server.stop();
      fs.rmSync(base, { recursive: true, force: true });
    },
  };
}

async function startServer(): Promise<DbServer> {
  if (process.env.SARSEN_TEST_CONTAINERS === '1') return containerServer();
  const fromEnv = envServer();
  if (fromEnv && (await answers(fromEnv))) return { admin: fromEnv, kind: 'server', stop: async () => {} };
  if (fromEnv) process.stderr.write(`test database: ${fromEnv.host}:${fromEnv.port} does not answer; using embedded PostgreSQL\n`);
  return embeddedServer();
}

export function dbServer(): Promise<DbServer> {
  return (serverPromise ??= startServer());
}

async function adminQuery(sql: string): Promise<void> {
  const { admin } = await dbServer();
  const client = new pg.Client(admin);
  client.on('error', () => undefined);
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

function template(): Promise<string> {
  return (templatePromise ??= (async () => {
    const name = `sarsen_tpl_${RUN}`;
    await adminQuery(`CREATE DATABASE ${name}`);
    const conn = { ...(await dbServer()).admin, database: name };
    const pool = createPool(conn, { max: 2, name: 'sarsen-test-template' });
    try {
      await migrate(conn, pool);
    } finally {
      await pool.end();
    }
    return name;
  })());
}

export type TestDatabase = { conn: ConnectionConfig; name: string; drop(): Promise<void> };

/** Test defaults: backends on 127.0.0.1 (the fake provider) must be allowed. */
export const TEST_SETTINGS: Partial<Record<SettingName, unknown>> = { backends_public_only: false };

let counter = 0;

/** A fresh, migrated database cloned from the template, with `settings` written over the defaults. */
export async function createTestDatabase(settings: Partial<Settings> = {}): Promise<TestDatabase> {
  const tpl = await template();
  const name = `sarsen_t_${RUN}_${++counter}`;
  // CREATE DATABASE ... TEMPLATE refuses to run while another clone of it is in progress.
  const clone = cloneChain.then(() => adminQuery(`CREATE DATABASE ${name} TEMPLATE ${tpl}`));
  cloneChain = clone.catch(() => undefined);
  await clone;
  const release = track('database', name);
  const conn = { ...(await dbServer()).admin, database: name };
  await writeSettings(conn, settings);
  return {
    conn,
    name,
    drop: async () => {
      await adminQuery(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      release();
    },
  };
}

/** Writes the test defaults and `settings` over a migrated database's settings. */
export async function writeSettings(conn: ConnectionConfig, settings: Partial<Settings> = {}): Promise<void> {
  const client = new pg.Client(conn);
  client.on('error', () => undefined);
  await client.connect();
  try {
    for (const [key, value] of Object.entries({ ...TEST_SETTINGS, ...settings })) {
      await client.query('UPDATE sarsen.settings SET value = $2::jsonb WHERE name = $1', [key, JSON.stringify(value)]);
    }
  } finally {
    await client.end();
  }
}

/** A new database with nothing in it (for tests of migrating from scratch). */
export async function createEmptyDatabase(): Promise<TestDatabase> {
  const name = `sarsen_e_${RUN}_${++counter}`;
  await adminQuery(`CREATE DATABASE ${name}`);
  const release = track('database', name);
  return {
    conn: { ...(await dbServer()).admin, database: name },
    name,
    drop: async () => {
      await adminQuery(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      release();
    },
  };
}

/** A pool on a test database that the leak guard watches. */
export function testPool(conn: ConnectionConfig, max = 4): pg.Pool & { release: () => void } {
  const pool = createPool(conn, { max, name: 'sarsen-test' });
  const release = track('pool', conn.database);
  const end = pool.end.bind(pool);
  pool.end = (async () => {
    await end();
    release();
  }) as typeof pool.end;
  return Object.assign(pool, { release });
}

/** Global teardown: drop the template, stop an embedded or container server. */
export async function shutdownDatabases(): Promise<void> {
  if (!serverPromise) return;
  const server = await serverPromise.catch(() => null);
  if (!server) return;
  if (templatePromise) {
    const tpl = await templatePromise.catch(() => null);
    if (tpl) await adminQuery(`DROP DATABASE IF EXISTS ${tpl} WITH (FORCE)`).catch(() => undefined);
  }
  await server.stop();
  serverPromise = null;
  templatePromise = null;
}
