// Console sessions (docs/administration.md "Sessions"): sign-in, sign-out, the password change, and
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
import { sessionExpiry } from '../../db/console.ts';
import { hashPassword, verifyPassword, verifyAgainstDummy } from '../../core/passwords.ts';
import { readPayload, email, isoTime } from './validate.ts';
import { countSignIn } from './sign-in-throttle.ts';

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

export const SESSION_COOKIE = 'sarsen_session';
const TOKEN = /^ses_[A-Za-z0-9_-]{16,128}$/;

/** The session token from `Authorization: Bearer` (scripts) or the console's HttpOnly cookie. */
export function sessionToken(req: Request): { token: string; fromCookie: boolean } | null {
  const m = /^\s*bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '');
  if (m) return TOKEN.test(m[1]!) ? { token: m[1]!, fromCookie: false } : null;
  for (const part of (req.headers.cookie ?? '').split(';')) {
    const [name, value] = part.trim().split('=', 2);
    if (name === SESSION_COOKIE && value !== undefined && TOKEN.test(value)) return { token: value, fromCookie: true };
  }
  return null;
}

/**
 * A cookie travels with requests other sites make, so a state-changing request carrying one
 * must come from this origin: the browser's Sec-Fetch-Site, else its Origin, says so.
 */
export function refuseCrossSite(req: Request): void {
  if (req.method === 'GET' || req.method === 'HEAD') return;
  const site = req.headers['sec-fetch-site'];
  const origin = req.headers.origin;
  let crossSite = site !== undefined && site !== 'same-origin';
  if (!crossSite && origin !== undefined) {
    try {
      crossSite = new URL(origin).host !== req.headers.host;
    } catch {
      crossSite = true;
    }
  }
  if (crossSite) throw new ServiceError('forbidden', 'A console request must come from the console\'s own origin.');
}

/**
 * First middleware of every administration route: a live session of the path's tenancy
 * (else 401), a chosen password unless `allowUnchosen` (else 403 password_change_required),
 * and at least `minRole` (else 403 forbidden).
 */
export function consoleAuth(deps: Deps, minRole: Role, opts: { allowUnchosen?: boolean } = {}): RequestHandler {
  return async (req: Request, res: Response, next: NextFunction) => {
    const token = sessionToken(req);
    if (token?.fromCookie) refuseCrossSite(req);
    const tokenHash = token === null ? null : hashSessionToken(token.token);
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

export const signInSchema = z.strictObject({
  email: z.string().max(1024),
  password: z.string().max(PASSWORD_MAX),
});

export const passwordChangeSchema = z.strictObject({
  current_password: z.string().max(PASSWORD_MAX),
  new_password: z
    .string()
    .min(PASSWORD_MIN, `must be at least ${PASSWORD_MIN} characters`)
    .max(PASSWORD_MAX, `must be at most ${PASSWORD_MAX} characters`),
});

export type StartedSession = { token: string; expiresAt: Date; user: { id: string; email: string; role: Role; password_chosen: boolean } };

/** Checks the password (throttled, one answer for every refusal) and opens a session. */
export async function startSession(
  deps: Deps,
  req: Request,
  res: Response,
  tenancy: string,
  body: z.infer<typeof signInSchema>,
): Promise<StartedSession> {
  const attempt = await countSignIn(deps, req, res, body.email);
  const parsedEmail = email.safeParse(body.email);
  const user = parsedEmail.success ? await findUserForSignIn(deps.pool, tenancy, parsedEmail.data) : null;
  // The same work whether or not the account exists: a real scrypt either way.
  const ok = user === null ? await verifyAgainstDummy(body.password) : await verifyPassword(body.password, user.password_hash);
  if (!ok || user === null || user.disabled) throw new ServiceError('unauthorised', SIGN_IN_REJECTED);
  await attempt.succeeded();
  const token = `ses_${crypto.randomBytes(32).toString('base64url')}`;
  const tokenHash = hashSessionToken(token);
  const expiresAt = await withTransaction(deps.pool, async (tx) => {
    await deleteExpiredSessions(tx, user.id);
    return insertSession(tx, { token_hash: tokenHash, user_id: user.id, ttl_seconds: SESSION_TTL_SECONDS });
  });
  return { token, expiresAt, user };
}

async function signIn(deps: Deps, req: Request, res: Response): Promise<void> {
  const body = await readPayload(req, signInSchema);
  const { token, expiresAt, user } = await startSession(deps, req, res, String(req.params.tenancy), body);
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

function sessionView(tenancy: string, user: StartedSession['user'], expiresAt: Date | null) {
  return {
    tenancy,
    user_id: user.id,
    email: user.email,
    role: user.role,
    expires_at: isoTime(expiresAt),
    password_change_required: !user.password_chosen,
  };
}

export function sessionRoutes(deps: Deps, router: Router): void {
  router.post('/:tenancy/v1/sessions', (req, res) => signIn(deps, req, res));
  // The console's sign-in: the same check, but the token goes into an HttpOnly cookie that
  // page scripts cannot read, and the answer carries everything else.
  router.post('/:tenancy/v1/sessions/cookie', async (req, res) => {
    refuseCrossSite(req);
    const body = await readPayload(req, signInSchema);
    const { token, expiresAt, user } = await startSession(deps, req, res, String(req.params.tenancy), body);
    const secure = req.secure || req.headers['x-forwarded-proto'] === 'https' ? '; Secure' : '';
    res.set('set-cookie', `${SESSION_COOKIE}=${token}; Path=/; HttpOnly; SameSite=Strict; Max-Age=${SESSION_TTL_SECONDS}${secure}`);
    res.status(201).json(sessionView(String(req.params.tenancy), user, expiresAt));
  });
  router.get('/:tenancy/v1/sessions/current', consoleAuth(deps, 'viewer', { allowUnchosen: true }), async (req, res) => {
    const { user, tokenHash } = consoleOf(res);
    const expiresAt = await sessionExpiry(deps.pool, tokenHash);
    res.json(sessionView(user.tenancy_slug, { id: user.user_id, email: user.email, role: user.role, password_chosen: user.password_chosen }, expiresAt));
  });
  router.delete('/:tenancy/v1/sessions/current', consoleAuth(deps, 'viewer', { allowUnchosen: true }), async (_req, res) => {
    await deleteSession(deps.pool, consoleOf(res).tokenHash);
    res.set('set-cookie', `${SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0`);
    res.status(204).end();
  });
  router.post('/:tenancy/v1/account/password', consoleAuth(deps, 'viewer', { allowUnchosen: true }), (req, res) =>
    changePassword(deps, req, res),
  );
}
