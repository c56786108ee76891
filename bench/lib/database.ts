// The database every benchmark runs against must be durable (docs/performance.md "How we measure"): fsync,
// synchronous_commit and full_page_writes on, as a user would run Sarsen. The server is the
// one CTX_DATABASE_* names, else the machine's PostgreSQL on 127.0.0.1:5432 when it answers,
// else embedded PostgreSQL started with durable settings. The settings it runs with are
// printed; a database that is not durable is refused unless `--allow-non-durable` is given.
import pg from 'pg';
import { dbServer, useDurableDatabase } from '../../test/support/db.ts';

const DURABLE = { fsync: 'on', synchronous_commit: 'on', full_page_writes: 'on' } as const;
const SHOWN = ['server_version', ...Object.keys(DURABLE), 'wal_sync_method', 'shared_buffers', 'max_connections', 'commit_delay', 'autovacuum'];

async function answers(conn: pg.ClientConfig): Promise<boolean> {
  const client = new pg.Client({ ...conn, connectionTimeoutMillis: 2000 });
  client.on('error', () => undefined);
  try {
    await client.connect();
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => undefined);
  }
}

export type BenchDatabase = { kind: string; settings: Record<string, string>; durable: boolean; describe: string };

/** Picks and checks the benchmark's database server; throws when it is not durable and that was not allowed. */
export async function benchDatabase(opts: { allowNonDurable: boolean }): Promise<BenchDatabase> {
  if (!process.env.CTX_DATABASE_HOST && (await answers({ host: '127.0.0.1', port: 5432, user: 'postgres', database: 'postgres' }))) {
    Object.assign(process.env, { CTX_DATABASE_HOST: '127.0.0.1', CTX_DATABASE_PORT: '5432', CTX_DATABASE_USER: 'postgres' });
  }
  useDurableDatabase();
  const server = await dbServer();
  const client = new pg.Client(server.admin);
  client.on('error', () => undefined);
  await client.connect();
  let settings: Record<string, string>;
  try {
    const { rows } = await client.query<{ name: string; setting: string }>(
      `SELECT name, current_setting(name) AS setting FROM unnest($1::text[]) AS name`,
      [SHOWN],
    );
    settings = Object.fromEntries(rows.map((r) => [r.name, r.setting]));
  } finally {
    await client.end();
  }
  const durable = Object.entries(DURABLE).every(([k, v]) => settings[k] === v);
  const describe = `${server.kind} PostgreSQL at ${server.admin.host}:${server.admin.port}: ${SHOWN.map((k) => `${k}=${settings[k]}`).join(', ')}${durable ? '' : '  ** NOT DURABLE **'}`;
  if (!durable && !opts.allowNonDurable) {
    throw new Error(
      `Refusing to benchmark against a database that is not durable (${describe}). A figure taken there says nothing about a durable proxy; pass --allow-non-durable to take it anyway.`,
    );
  }
  return { kind: server.kind, settings, durable, describe };
}
