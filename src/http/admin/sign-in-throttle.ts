// The sign-in throttle (README "Sign-in throttling"): every attempt counts against its account
// and its client address before the password is checked; past either limit within the window
// the answer is 429 with Retry-After, the same whether or not the account exists.
import type { Request, Response } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { clientAddress, throttleKeys } from '../../core/sign-in-throttle.ts';
import { countAttempt, attemptSucceeded } from '../../db/sign-in-attempts.ts';

export type Counted = { succeeded(): Promise<void> };

/** Counts this attempt; throws 429 (Retry-After set on `res`) when it is over a limit. */
export async function countSignIn(deps: Deps, req: Request, res: Response, email: string): Promise<Counted> {
  const s = deps.settings.current();
  const address = clientAddress(req.socket.remoteAddress, req.headers['x-forwarded-for'], s.trusted_proxy_hops);
  const keys = throttleKeys(deps.secrets.apiKeyHashKey, { tenancy: String(req.params.tenancy), email, address });
  const [account, byAddress] = await countAttempt(deps.pool, [keys.account, keys.address], s.sign_in_window_ms);
  const over = [
    account!.attempts > s.sign_in_failures_per_account ? account!.retryAfterSeconds : 0,
    byAddress!.attempts > s.sign_in_failures_per_address ? byAddress!.retryAfterSeconds : 0,
  ];
  if (over.some((seconds) => seconds > 0)) {
    res.set('retry-after', String(Math.max(...over)));
    throw new ServiceError('too_many_attempts');
  }
  return { succeeded: () => attemptSucceeded(deps.pool, keys.account, keys.address) };
}
