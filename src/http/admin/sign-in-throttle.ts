// The sign-in throttle (docs/administration.md "Sign-in throttling"): every attempt counts against
// its account and client address together and its address, and, unless refused, its account,
// before the password is checked; past a limit (see refusal in core) the answer is 429 with
// Retry-After, the same whether or not the account exists.
import type { Request, Response } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { clientAddress, refusal, throttleKeys } from '../../core/sign-in-throttle.ts';
import { countAttempt, attemptSucceeded } from '../../db/sign-in-attempts.ts';

export type Counted = { succeeded(): Promise<void> };

/** Counts this attempt; throws 429 (Retry-After set on `res`) when it is over a limit. */
export async function countSignIn(deps: Deps, req: Request, res: Response, email: string): Promise<Counted> {
  const s = deps.settings.current();
  const address = clientAddress(req.socket.remoteAddress, req.headers['x-forwarded-for'], s.trusted_proxy_hops);
  const keys = throttleKeys(deps.secrets.apiKeyHashKey, { tenancy: String(req.params.tenancy), email, address });
  const limits = { perAccountAddress: s.sign_in_failures_per_account_address, perAddress: s.sign_in_failures_per_address, perAccount: s.sign_in_failures_per_account };
  const wait = await countAttempt(deps.pool, keys, s.sign_in_window_ms, (counts) => refusal(counts, limits));
  if (wait > 0) {
    res.set('retry-after', String(wait));
    throw new ServiceError('too_many_attempts');
  }
  return { succeeded: () => attemptSucceeded(deps.pool, keys.pair, [keys.account, keys.address]) };
}
