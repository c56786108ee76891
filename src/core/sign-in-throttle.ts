// Sign-in throttling, the pure part: who a sign-in attempt is counted against, and when it is
// refused. An attempt counts against its account and client address together (the pair) and
// against its address, refused or not, so a guesser who goes on while refused stays refused;
// only an attempt that is not refused counts against its account (the tenancy and the normalised
// email, whether or not such an account exists, so the answer cannot tell). All three are stored
// only as keyed hashes, never as the email or address itself. The pair and the address limit a
// guesser; the account's count is only a ceiling for addresses that already tried that account,
// and refused attempts do not raise it, so a throttled guesser cannot keep an owner signing in
// from elsewhere out of their own console.
import crypto from 'node:crypto';
import { isIPv4 } from 'node:net';
import { parseIPv6 } from './address-policy.ts';

/**
 * The client's address: the socket's peer, or with `trustedHops` proxies in front of Sarsen,
 * the X-Forwarded-For entry the outermost of them wrote. Each proxy appends the address it
 * received the request from, so only the last `trustedHops` entries were written by proxies
 * the operator vouches for; anything left of them is the client's to forge.
 */
export function clientAddress(peer: string | undefined, forwardedFor: string | string[] | undefined, trustedHops: number): string {
  const chain = (Array.isArray(forwardedFor) ? forwardedFor.join(',') : (forwardedFor ?? ''))
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '');
  chain.push(peer ?? '');
  return chain[Math.max(0, chain.length - 1 - trustedHops)]!;
}

/**
 * What one client address is counted under: an IPv4 address (v4-mapped IPv6 included) as
 * itself, an IPv6 address by its /64, the block a single subscriber is usually given, so
 * walking through one's own addresses does not earn fresh attempts.
 */
export function addressBucket(address: string): string {
  const v6 = isIPv4(address) ? null : parseIPv6(address);
  if (v6 === null) return address.toLowerCase();
  const mapped = v6.slice(0, 5).every((g) => g === 0) && v6[5] === 0xffff;
  if (mapped) return [v6[6]! >> 8, v6[6]! & 0xff, v6[7]! >> 8, v6[7]! & 0xff].join('.');
  return `${v6.slice(0, 4).map((g) => g.toString(16)).join(':')}::/64`;
}

/** An email as accounts are matched: trimmed, lower-cased (see the `email` payload rule). */
export function normaliseEmail(email: string): string {
  return email.trim().toLowerCase();
}

function keyed(secret: Buffer, parts: readonly string[]): Buffer {
  // JSON keeps the parts apart whatever they hold.
  return crypto.createHmac('sha256', secret).update(JSON.stringify(['sarsen sign-in throttle', ...parts])).digest();
}

export type ThrottleKeys = { pair: Buffer; account: Buffer; address: Buffer };

/** The three keys an attempt counts against: its account and address together, its account, its address. */
export function throttleKeys(secret: Buffer, a: { tenancy: string; email: string; address: string }): ThrottleKeys {
  const tenancy = a.tenancy.toLowerCase();
  const email = normaliseEmail(a.email);
  const bucket = addressBucket(a.address);
  return {
    pair: keyed(secret, ['pair', tenancy, email, bucket]),
    account: keyed(secret, ['account', tenancy, email]),
    address: keyed(secret, ['address', bucket]),
  };
}

/**
 * Attempts counted in a key's window (this one included), and the seconds left of the window.
 * For the account, only attempts that were not refused, plus this one.
 */
export type Count = Readonly<{ attempts: number; retryAfterSeconds: number }>;

export type ThrottleLimits = Readonly<{ perAccountAddress: number; perAddress: number; perAccount: number }>;

/**
 * How many seconds the caller must wait (0: the attempt goes on to the password check). Past
 * the pair's limit, or the address's, the address waits for that window. Past the account's
 * ceiling, only an address that already tried this account in the pair's window waits (until
 * either window ends); an address with no attempt on it, the owner's elsewhere, goes on.
 */
export function refusal(c: Readonly<{ pair: Count; account: Count; address: Count }>, l: ThrottleLimits): number {
  return Math.max(
    c.pair.attempts > l.perAccountAddress ? c.pair.retryAfterSeconds : 0,
    c.address.attempts > l.perAddress ? c.address.retryAfterSeconds : 0,
    c.account.attempts > l.perAccount && c.pair.attempts > 1 ? Math.min(c.account.retryAfterSeconds, c.pair.retryAfterSeconds) : 0,
  );
}
