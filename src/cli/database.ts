// Where the database is: the server named by CTX_DATABASE_* (password from the secrets
// directory), or, with no CTX_DATABASE_HOST, embedded PostgreSQL under CTX_DATA_DIR.
import path from 'node:path';
import type { Environment } from '../config/config.ts';
import { ensureDevSecrets, readSecrets, type Secrets } from '../config/secrets.ts';
import type { ConnectionConfig } from '../db/pool.ts';
import { startEmbedded, ensureDatabase } from '../db/embedded.ts';

export type OpenDatabase = { conn: ConnectionConfig; secrets: Secrets; close(): Promise<void> };

export const EMBEDDED_DATABASE = 'sarsen';

export async function openDatabase(env: Environment): Promise<OpenDatabase> {
  if (env.database) {
    const secrets = readSecrets(env.secretsDir);
    return { conn: { ...env.database, password: secrets.databasePassword }, secrets, close: async () => {} };
  }
  ensureDevSecrets(env.secretsDir);
  const secrets = readSecrets(env.secretsDir);
  const server = await startEmbedded({ dir: path.join(env.dataDir, 'pg'), password: secrets.databasePassword });
  try {
    await ensureDatabase(server.conn, EMBEDDED_DATABASE);
  } catch (err) {
    await server.stop();
    throw err;
  }
  return { conn: { ...server.conn, database: EMBEDDED_DATABASE }, secrets, close: () => server.stop() };
}
