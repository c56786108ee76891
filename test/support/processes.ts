// A Sarsen deployment of real processes on one test database: `sarsen --role api` and any
// number of `--role executor`, each a child process of the command as users run it.
import pg from 'pg';
import type { TestServer } from './server.ts';
import { createTestDatabase, testPool, type TestDatabase } from './db.ts';
import { makeSecretsDir, sarsenEnv, spawnSarsen, type SarsenChild, type SecretsDir } from './child.ts';
import type { Role } from '../../src/config/config.ts';
import type { Settings } from '../../src/config/settings.ts';

export type SarsenProcess = SarsenChild & { role: Role; url: string; owner: string | null };

export type Deployment = {
  db: TestDatabase;
  pool: pg.Pool & { release: () => void };
  secrets: SecretsDir;
  /** Starts `sarsen --role role`, with `env` added to its environment. */
  start(role: Role, env?: Record<string, string>): Promise<SarsenProcess>;
  /** Enough of a TestServer for the provisioning helpers: the api process's url and a pool. */
  asServer(api: SarsenProcess): TestServer;
  close(): Promise<void>;
};

/** On a fresh test database, or on `on` (a database the test owns otherwise). */
export async function startDeployment(settings: Partial<Settings> = {}, on?: TestDatabase): Promise<Deployment> {
  const db = on ?? (await createTestDatabase(settings));
  const secrets = makeSecretsDir(db.conn);
  const pool = testPool(db.conn);
  const children = new Set<SarsenProcess>();
  return {
    db,
    pool,
    secrets,
    async start(role, env = {}) {
      const child = spawnSarsen(['--role', role, '--port', '0'], sarsenEnv(db.conn, secrets.dir, env));
      const [, url] = await child.waitFor(/"url":"(http:[^"]+)"/);
      const owner = role === 'api' ? null : (await child.waitFor(/"owner":"(wrk_[0-9A-Z]+)"/))[1]!;
      const p = { ...child, role, url: url!, owner };
      children.add(p);
      void child.exited.then(() => children.delete(p));
      return p;
    },
    asServer(api) {
      return { url: api.url, pool, db } as unknown as TestServer;
    },
    async close() {
      await Promise.all([...children].map((c) => c.kill('SIGKILL')));
      await pool.end();
      secrets.remove();
      await db.drop();
    },
  };
}
