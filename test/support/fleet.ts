// Sarsen processes of any role and flags on one database, each a child process of the command
// as users run it, named by the id it prints (its connections carry it in pg_stat_activity).
import type { ConnectionConfig } from '../../src/db/pool.ts';
import type { Role } from '../../src/config/config.ts';
import { sarsenEnv, spawnSarsen, type SarsenChild } from './child.ts';

export type FleetProcess = SarsenChild & { role: Role; url: string; processId: string };

/** Starts `sarsen --role role --port 0 ...args` against `conn` and waits until it listens. */
export async function startProcess(conn: ConnectionConfig, secretsDir: string, role: Role, args: string[] = [], env: Record<string, string> = {}): Promise<FleetProcess> {
  const child = spawnSarsen(['--role', role, '--port', '0', '--host', '127.0.0.1', ...args], sarsenEnv(conn, secretsDir, env));
  try {
    const [line] = await child.waitFor(/[^\n]*"message":"sarsen listening"[^\n]*/, 60_000);
    const url = /"url":"(http:[^"]+)"/.exec(line)![1]!;
    const processId = /"process_id":"(wrk_[0-9A-Z]+)"/.exec(line)![1]!;
    return { ...child, role, url, processId };
  } catch (err) {
    await child.kill('SIGKILL');
    throw err;
  }
}

/** Connections in pg_stat_activity on database `name`, by process id and purpose (`sarsen-<purpose> <id>`). */
export const CONNECTIONS_SQL = `SELECT split_part(application_name, ' ', 2) AS process, substr(split_part(application_name, ' ', 1), 8) AS purpose, count(*)::int AS n
  FROM pg_stat_activity WHERE datname = $1 AND application_name ~ '^sarsen-[a-z]+ wrk_' GROUP BY 1, 2`;
