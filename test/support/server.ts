// Starts the real Sarsen in this process, on port 0, against a fresh test database.
import crypto from 'node:crypto';
import { startSarsen, type Sarsen } from '../../src/server.ts';
import type { Role } from '../../src/config/config.ts';
import type { Settings } from '../../src/config/settings.ts';
import type { Secrets } from '../../src/config/secrets.ts';
import { createTestDatabase, type TestDatabase } from './db.ts';
import { track } from './resources.ts';

export const testSecrets = (): Secrets =>
  Object.freeze({
    credentialKey: crypto.randomBytes(32),
    apiKeyHashKey: crypto.randomBytes(32),
    databasePassword: 'unused-with-trust-auth',
  });

export type TestServer = Sarsen & { db: TestDatabase; secrets: Secrets; close(): Promise<void> };

export async function startTestServer(
  opts: { db?: TestDatabase; role?: Role; credentialPassthrough?: boolean; settings?: Partial<Settings>; secrets?: Secrets; executorConcurrency?: number } = {},
): Promise<TestServer> {
  const ownDb = !opts.db;
  const db = opts.db ?? (await createTestDatabase(opts.settings));
  const secrets = opts.secrets ?? testSecrets();
  let sarsen: Sarsen;
  try {
    sarsen = await startSarsen({
      conn: { ...db.conn, password: db.conn.password },
      serve: { role: opts.role ?? 'both', credentialPassthrough: opts.credentialPassthrough ?? false, port: 0, host: '127.0.0.1', executorConcurrency: opts.executorConcurrency ?? 64 },
      secrets,
    });
  } catch (err) {
    if (ownDb) await db.drop();
    throw err;
  }
  const release = track('server', sarsen.url);
  return {
    ...sarsen,
    db,
    secrets,
    async close() {
      await sarsen.stop();
      if (ownDb) await db.drop();
      release();
    },
  };
}
