// Console sessions (DESIGN.md "Control plane"): sign-in, sign-out, the password change, and
// the middleware every administration route runs first. A session token is `ses_` and 32
// random bytes; only its SHA-256 is stored.
import crypto from 'node:crypto';
import { z } from 'zod';
import type { Request, Response, NextFunction, RequestHandler, Router } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { withTransaction } from '../../db/pool.ts';
import {
  findUser,
  findUserForSignIn,
  findSessionUser,
  insertSession,
  deleteSession,
  deleteUserSessions,
  deleteExpiredSessions,
  setPassword,
  type Role,
  type SessionUser,
} from '../../db/tenancies.ts';
import { hashPassword, verifyPassword, verifyAgainstDummy } from '../../core/passwords.ts';
import { readPayload, email, isoTime } from './validate.ts';

export const SESSION_TTL_SECONDS = 12 * 60 * 60;
export const PASSWORD_MIN = 12;
export const PASSWORD_MAX = 1024;

const RANK: Readonly<Record<Role, number>> = { viewer: 1, admin: 2, owner: 3 };

// One answer for every rejected sign-in and one for every unusable session, so neither
// tells an email that exists from one that does not.
const SIGN_IN_REJECTED = 'The email or password is not correct.';
const NO_SESSION = 'Sign in first: the session is missing, expired or not valid for this tenancy.';

export type ConsoleCaller = { user: SessionUser; tokenHash: Buffer };

export function consoleOf(res: Response): ConsoleCaller {
  const c = (res.locals as { console?: ConsoleCaller }).console;
  if (!c) throw new Error('consoleAuth did not run for this route');
  return c;
}

export function hashSessionToken(token: string): Buffer {
  return crypto.createHash('sha256').update(token, 'utf8').digest();
}

function sessionToken(req: Request): string | null {
  const m = /^\s*bearer\s+(ses_[A-Za-z0-9_-]{16,128})\s*$/i.exec(req.headers.authorization ?? '');
  return m ? m[1]! : null;
}

/**
 * First middleware of every administration route: a live session of the path's tenancy
 * (else 401), a chosen password unless `allowUnchosen` (else 403 password_change_required),
 * and at least `minRole` (else 403 forbidden).
 */
export function consoleAuth(deps: Deps, minRole: Role, opts: { allowUnchosen?: boolean } = {}): RequestHandler {
  return async (req: Request, res: Response, next: NextFunction) => {
    const token = sessionToken(req);
    const tokenHash = token === null ? null : hashSessionToken(token);
    const user = tokenHash === null ? null : await findSessionUser(deps.pool, tokenHash);
    if (user === null || user.tenancy_slug !== req.params.tenancy) throw new ServiceError('unauthorised', NO_SESSION);
    if (!user.password_chosen && !opts.allowUnchosen) {
      throw new ServiceError(
        'password_change_required',
        `This account still has a generated password; choose one first: POST /${user.tenancy_slug}/v1/account/password.`,
      );
    }
    if (RANK[user.role] < RANK[minRole]) {
      throw new ServiceError('forbidden', `This needs the ${minRole} role; the account's role is ${user.role}.`);
    }
    res.locals.console = { user, tokenHash: tokenHash! } satisfies ConsoleCaller;
    next();
  };
}

const signInSchema = z.strictObject({
  email: z.string().max(1024),
  password: z.string().max(PASSWORD_MAX),
});

const passwordChangeSchema = z.strictObject({
  current_password: z.string().max(PASSWORD_MAX),
  new_password: z
    .string()
    .min(PASSWORD_MIN, `must be at least ${PASSWORD_MIN} characters`)
    .max(PASSWORD_MAX, `must be at most ${PASSWORD_MAX} characters`),
});

async function signIn(deps: Deps, req: Request, res: Response): Promise<void> {
  const body = await readPayload(req, signInSchema);
  const parsedEmail = email.safeParse(body.email);
  const user = parsedEmail.success ? await findUserForSignIn(deps.pool, String(req.params.tenancy), parsedEmail.data) : null;
  // The same work whether or not the account exists: a real scrypt either way.
  const ok = user === null ? await verifyAgainstDummy(body.password) : await verifyPassword(body.password, user.password_hash);
  if (!ok || user === null || user.disabled) throw new ServiceError('unauthorised', SIGN_IN_REJECTED);
  const token = `ses_${crypto.randomBytes(32).toString('base64url')}`;
  const tokenHash = hashSessionToken(token);
  const expiresAt = await withTransaction(deps.pool, async (tx) => {
    await deleteExpiredSessions(tx, user.id);
    return insertSession(tx, { token_hash: tokenHash, user_id: user.id, ttl_seconds: SESSION_TTL_SECONDS });
  });
  res.status(201).json({
    token,
    expires_at: isoTime(expiresAt),
    user_id: user.id,
    role: user.role,
    password_change_required: !user.password_chosen,
  });
}

async function changePassword(deps: Deps, req: Request, res: Response): Promise<void> {
  const { user, tokenHash } = consoleOf(res);
  const body = await readPayload(req, passwordChangeSchema);
  const account = await findUser(deps.pool, user.tenancy_id, user.user_id);
  if (account === null || !(await verifyPassword(body.current_password, account.password_hash))) {
    throw new ServiceError('password_rejected');
  }
  if (body.new_password === body.current_password) {
    throw new ServiceError('bad_request', 'new_password: must differ from the current password');
  }
  const hash = await hashPassword(body.new_password);
  await withTransaction(deps.pool, async (tx) => {
    await setPassword(tx, account.id, hash, true);
    // Whoever else held the old password is signed out; this session carries on.
    await deleteUserSessions(tx, account.id, tokenHash);
  });
  res.status(204).end();
}

export function sessionRoutes(deps: Deps, router: Router): void {
  router.post('/:tenancy/v1/sessions', (req, res) => signIn(deps, req, res));
  router.delete('/:tenancy/v1/sessions/current', consoleAuth(deps, 'viewer', { allowUnchosen: true }), async (_req, res) => {
    await deleteSession(deps.pool, consoleOf(res).tokenHash);
    res.status(204).end();
  });
  router.post('/:tenancy/v1/account/password', consoleAuth(deps, 'viewer', { allowUnchosen: true }), (req, res) =>
    changePassword(deps, req, res),
  );
}
