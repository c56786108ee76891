// /{tenancy}/v1/users (owner): console accounts. A new account gets a generated password,
// answered once and unchosen, so its first sign-in must change it. The tenancy always keeps
// at least one enabled owner.
import { z } from 'zod';
import type { Router } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { newId } from '../../core/ids.ts';
import { generatePassword, hashPassword } from '../../core/passwords.ts';
import { withTransaction, type PoolClient } from '../../db/pool.ts';
import {
  insertUser,
  findUser,
  listUsers,
  lockActiveOwners,
  updateUser,
  deleteUser,
  deleteUserSessions,
  type UserRow,
} from '../../db/tenancies.ts';
import { isUniqueViolation } from '../../db/pg-errors.ts';
import { consoleAuth, consoleOf } from './console-auth.ts';
import { readPayload, email, isoTime } from './validate.ts';

const role = z.enum(['owner', 'admin', 'viewer']);

export const createSchema = z.strictObject({ email, role });
export const patchSchema = z.strictObject({ role: role.optional(), disabled: z.boolean().optional() });

export function userView(u: UserRow) {
  return {
    user_id: u.id,
    email: u.email,
    role: u.role,
    disabled: u.disabled,
    password_chosen: u.password_chosen,
    created_at: isoTime(u.created_at),
  };
}

const missing = () => new ServiceError('not_found', 'No such user in this tenancy.');

/** Refuses a change that would leave the tenancy without an enabled owner. */
async function keepAnOwner(tx: PoolClient, tenancyId: string, userId: string, staysOwner: boolean): Promise<void> {
  const owners = await lockActiveOwners(tx, tenancyId);
  if (!staysOwner && owners.length === 1 && owners[0] === userId) {
    throw new ServiceError('conflict', 'The tenancy must keep at least one enabled owner.');
  }
}

export function userRoutes(deps: Deps, router: Router): void {
  const base = '/:tenancy/v1/users';
  const one = `${base}/:user_id`;

  router.get(base, consoleAuth(deps, 'owner'), async (_req, res) => {
    res.json({ data: (await listUsers(deps.pool, consoleOf(res).user.tenancy_id)).map(userView) });
  });

  router.post(base, consoleAuth(deps, 'owner'), async (req, res) => {
    const body = await readPayload(req, createSchema);
    const password = generatePassword();
    try {
      const u = await insertUser(deps.pool, {
        id: newId('usr'),
        tenancy_id: consoleOf(res).user.tenancy_id,
        email: body.email,
        password_hash: await hashPassword(password),
        role: body.role,
        password_chosen: false,
      });
      res.status(201).json({ ...userView(u), password });
    } catch (err) {
      if (isUniqueViolation(err)) throw new ServiceError('conflict', `An account for ${body.email} already exists in this tenancy.`);
      throw err;
    }
  });

  router.patch(one, consoleAuth(deps, 'owner'), async (req, res) => {
    const patch = await readPayload(req, patchSchema);
    const tenancyId = consoleOf(res).user.tenancy_id;
    const id = String(req.params.user_id);
    const u = await withTransaction(deps.pool, async (tx) => {
      const cur = await findUser(tx, tenancyId, id);
      if (cur === null) throw missing();
      const staysOwner = (patch.role ?? cur.role) === 'owner' && !(patch.disabled ?? cur.disabled);
      await keepAnOwner(tx, tenancyId, id, staysOwner);
      const updated = await updateUser(tx, tenancyId, id, patch);
      if (updated?.disabled) await deleteUserSessions(tx, id);
      return updated;
    });
    if (u === null) throw missing();
    res.json(userView(u));
  });

  router.delete(one, consoleAuth(deps, 'owner'), async (req, res) => {
    const tenancyId = consoleOf(res).user.tenancy_id;
    const id = String(req.params.user_id);
    await withTransaction(deps.pool, async (tx) => {
      if ((await findUser(tx, tenancyId, id)) === null) throw missing();
      await keepAnOwner(tx, tenancyId, id, false);
      await deleteUser(tx, tenancyId, id);
    });
    res.status(204).end();
  });
}
