// Sign-in throttling, the pure part: who a sign-in attempt is counted against. An attempt
// counts against its account (the tenancy and the normalised email, whether or not such an
// account exists, so the answer cannot tell) and against the client address it came from.
// Both are stored only as keyed hashes, never as the email or address itself.
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

/** The two keys an attempt counts against: its account's, then its address's. */
export function throttleKeys(secret: Buffer, a: { tenancy: string; email: string; address: string }): { account: Buffer; address: Buffer } {
  return {
    account: keyed(secret, ['account', a.tenancy.toLowerCase(), normaliseEmail(a.email)]),
    address: keyed(secret, ['address', addressBucket(a.address)]),
  };
}
