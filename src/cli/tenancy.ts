// `sarsen tenancy create <slug> --owner <email>`, and the embedded quick start's first run.
// Both create an owner with a generated, unchosen password and print it once; it is never
// logged.
import type { OpenDatabase } from './database.ts';
import type { ConnectionConfig, PoolClient } from '../db/pool.ts';
import { createPool, withTransaction } from '../db/pool.ts';
import { migrate } from '../db/migrate.ts';
import { storeSetting } from '../db/settings.ts';
import { insertTenancy, insertUser, anyTenancyExists, lockBootstrap } from '../db/tenancies.ts';
import { insertNamespace } from '../db/namespaces.ts';
import { isUniqueViolation } from '../db/pg-errors.ts';
import { ConfigError } from '../config/config.ts';
import { newId } from '../core/ids.ts';
import { isTenancyName } from '../core/slugs.ts';
import { generatePassword, hashPassword } from '../core/passwords.ts';
import { email as emailSchema } from '../http/admin/validate.ts';

const USAGE = 'usage: sarsen tenancy create <slug> --owner <email>';

export type CreatedTenancy = { tenancy_id: string; slug: string; owner_id: string; owner_email: string };

/** Inserts a tenancy and its owner (password unchosen) in the caller's transaction. */
export async function createTenancyWithOwner(
  tx: PoolClient,
  t: { slug: string; ownerEmail: string; passwordHash: string },
): Promise<CreatedTenancy> {
  const tenancy = await insertTenancy(tx, { id: newId('ten'), slug: t.slug, display_name: t.slug });
  const owner = await insertUser(tx, {
    id: newId('usr'),
    tenancy_id: tenancy.id,
    email: t.ownerEmail,
    password_hash: t.passwordHash,
    role: 'owner',
    password_chosen: false,
  });
  return { tenancy_id: tenancy.id, slug: tenancy.slug, owner_id: owner.id, owner_email: owner.email };
}

export async function tenancyCommand(
  db: OpenDatabase,
  args: string[],
  owner: string | undefined,
  out: (line: string) => void,
): Promise<void> {
  const [verb, slug, ...rest] = args;
  if (verb !== 'create' || slug === undefined || rest.length > 0 || owner === undefined) throw new ConfigError(USAGE);
  if (!isTenancyName(slug)) {
    throw new ConfigError(`${JSON.stringify(slug)} is not a tenancy slug: 1-63 lowercase letters, digits or hyphens, starting with a letter or digit (not v1, healthz or readyz).`);
  }
  const email = emailSchema.safeParse(owner);
  if (!email.success) throw new ConfigError(`--owner ${JSON.stringify(owner)} is not an email address.`);
  const pool = createPool(db.conn, { max: 2, name: 'sarsen-cli' });
  try {
    await migrate(db.conn, pool);
    const password = generatePassword();
    const passwordHash = await hashPassword(password);
    let created: CreatedTenancy;
    try {
      created = await withTransaction(pool, (tx) => createTenancyWithOwner(tx, { slug, ownerEmail: email.data, passwordHash }));
    } catch (err) {
      if (isUniqueViolation(err)) throw new ConfigError(`A tenancy ${JSON.stringify(slug)} already exists.`);
      throw err;
    }
    out(`tenancy: ${created.slug} (${created.tenancy_id})`);
    out(`owner: ${created.owner_email} (${created.owner_id})`);
    out(`password: ${password}`);
    out(`The password is shown once; the first sign-in must replace it (POST /${created.slug}/v1/account/password).`);
  } finally {
    await pool.end();
  }
}

export type FirstRun = { tenancy: string; namespace: string; email: string; password: string };

export const FIRST_RUN = { tenancy: 'default', namespace: 'default', email: 'admin@localhost' } as const;

/**
 * Embedded quick start: when the database holds no tenancy yet, create tenancy `default`,
 * namespace `default` and owner `admin@localhost`, and let backends reach local addresses
 * (`backends_public_only` off). Null when this is not the first run.
 */
export async function bootstrapEmbedded(conn: ConnectionConfig): Promise<FirstRun | null> {
  const pool = createPool(conn, { max: 2, name: 'sarsen-bootstrap' });
  try {
    await migrate(conn, pool);
    if (await anyTenancyExists(pool)) return null;
    const password = generatePassword();
    const passwordHash = await hashPassword(password);
    const created = await withTransaction(pool, async (tx) => {
      await lockBootstrap(tx); // two processes starting together: one creates, one sees it
      if (await anyTenancyExists(tx)) return false;
      const t = await createTenancyWithOwner(tx, { slug: FIRST_RUN.tenancy, ownerEmail: FIRST_RUN.email, passwordHash });
      await insertNamespace(tx, { id: newId('ns'), tenancy_id: t.tenancy_id, name: FIRST_RUN.namespace, retention_minutes: null, spend_limit: null });
      return true;
    });
    if (!created) return null;
    await storeSetting(pool, 'backends_public_only', false);
    return { ...FIRST_RUN, password };
  } finally {
    await pool.end();
  }
}

/** The block `sarsen serve` prints once on an embedded first run. */
export function firstRunBanner(first: FirstRun, url: string): string {
  const rule = '-'.repeat(72);
  return [
    rule,
    `Sarsen first run: created tenancy "${first.tenancy}", namespace "${first.namespace}"`,
    `and the owner account ${first.email}. Its password is shown this once:`,
    '',
    `password: ${first.password}`,
    '',
    `Console:  ${url}/console/  (tenancy "${first.tenancy}", email ${first.email}, the password above)`,
    '',
    `Sign in:  curl -s -X POST ${url}/${first.tenancy}/v1/sessions -H 'content-type: application/json' \\`,
    `            -d '{"email":"${first.email}","password":"<the password above>"}'`,
    `then choose a new password: POST ${url}/${first.tenancy}/v1/account/password.`,
    'Backends may point at local addresses here (setting backends_public_only is off).',
    rule,
  ].join('\n');
}
