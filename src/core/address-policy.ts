// Policy behind `422 backend_host_refused` (docs/api.md "Errors"; docs/administration.md "Backend
// addresses"): with `backends_public_only` on, a backend may not point into the deployment's own
// network. The host is judged when the backend is created and again at connect time, because a
// name may resolve elsewhere later.
//
// IPv6 addresses that carry an IPv4 address (mapped, compatible, SIIT, NAT64, 6to4) are
// judged by the address they carry, so `::ffff:127.0.0.1` is as refused as `127.0.0.1`.
import { lookup as dnsLookup, promises as dnsPromises } from 'node:dns';
import type { LookupAddress } from 'node:dns';
import { isIPv6 } from 'node:net';
import type { LookupFunction } from 'node:net';
import ipaddr from 'ipaddr.js';

export const HOST_REFUSED_CODE = 'SARSEN_HOST_REFUSED';

type Cidr<T extends ipaddr.IPv4 | ipaddr.IPv6> = [T, number];
const v4 = (cidr: string) => ipaddr.IPv4.parseCIDR(cidr);
const v6 = (cidr: string) => ipaddr.IPv6.parseCIDR(cidr);

const V4_REFUSED: readonly (readonly [Cidr<ipaddr.IPv4>, string])[] = [
  [v4('255.255.255.255/32'), 'broadcast'],
  [v4('0.0.0.0/8'), 'unspecified'],
  [v4('10.0.0.0/8'), 'private'],
  [v4('100.64.0.0/10'), 'shared (CGNAT)'],
  [v4('127.0.0.0/8'), 'loopback'],
  [v4('169.254.0.0/16'), 'link-local'],
  [v4('172.16.0.0/12'), 'private'],
  [v4('192.0.0.0/24'), 'reserved (IETF protocol assignments)'],
  [v4('192.168.0.0/16'), 'private'],
  [v4('198.18.0.0/15'), 'reserved (benchmarking)'],
  [v4('224.0.0.0/4'), 'multicast'],
  [v4('240.0.0.0/4'), 'reserved'],
];

// Ranges whose verdict comes from an embedded IPv4 address are in V6_EMBEDDINGS, not here.
const V6_REFUSED: readonly (readonly [Cidr<ipaddr.IPv6>, string])[] = [
  [v6('::/128'), 'unspecified'],
  [v6('::1/128'), 'loopback'],
  [v6('64:ff9b:1::/48'), 'private (local-use NAT64)'],
  [v6('fc00::/7'), 'private (unique local)'],
  [v6('fe80::/10'), 'link-local'],
  [v6('fec0::/10'), 'private (site-local)'],
  [v6('ff00::/8'), 'multicast'],
];

// Where an IPv4 address sits inside an IPv6 one: the prefix, and the byte offset of the IPv4 address.
const V6_EMBEDDINGS: readonly { cidr: Cidr<ipaddr.IPv6>; at: number; name: string }[] = [
  { cidr: v6('::ffff:0:0/96'), at: 12, name: 'v4-mapped' },
  { cidr: v6('::ffff:0:0:0/96'), at: 12, name: 'v4-translated' },
  { cidr: v6('::/96'), at: 12, name: 'v4-compatible' },
  { cidr: v6('64:ff9b::/96'), at: 12, name: 'NAT64' },
  { cidr: v6('2002::/16'), at: 2, name: '6to4' },
];

/**
 * IPv4 in any form the URL parser and inet_aton accept: 1 to 4 parts, each decimal,
 * octal (leading 0) or hex (0x), the last part filling the remaining bytes. `127.1`
 * and `0x7f000001` are both loopback to the resolver, so they must be to us too.
 */
function parseV4(s: string): ipaddr.IPv4 | null {
  const text = s.endsWith('.') ? s.slice(0, -1) : s; // a trailing dot is a rooted name
  try {
    return ipaddr.IPv4.parse(text);
  } catch {
    return null;
  }
}

/** IPv6 text (zero compression, embedded IPv4 tail, zone id), only as Node itself would connect to it. */
function parseV6(s: string): ipaddr.IPv6 | null {
  if (!isIPv6(s)) return null;
  try {
    return ipaddr.IPv6.parse(s);
  } catch {
    return null;
  }
}

/** The IPv4 address as a 32-bit number, or null. */
export function parseIPv4(s: string): number | null {
  const a = parseV4(s);
  return a === null ? null : a.octets.reduce((n, o) => n * 256 + o, 0);
}

/** The IPv6 address as eight 16-bit groups, or null. */
export function parseIPv6(s: string): number[] | null {
  return parseV6(s)?.parts ?? null;
}

function v4Reason(a: ipaddr.IPv4): string | null {
  for (const [cidr, label] of V4_REFUSED) if (a.match(cidr)) return `${a.toString()} is a ${label} address`;
  return null;
}

function v6Reason(a: ipaddr.IPv6, text: string): string | null {
  for (const [cidr, label] of V6_REFUSED) if (a.match(cidr)) return `${text} is a ${label} address`;
  for (const e of V6_EMBEDDINGS) {
    if (!a.match(e.cidr)) continue;
    const inner = new ipaddr.IPv4(a.toByteArray().slice(e.at, e.at + 4));
    const reason = v4Reason(inner);
    return reason === null ? null : `${text} is ${e.name} and embeds ${reason}`;
  }
  return null;
}

/**
 * Why an address is refused, or null when it is allowed. Text that is not an IP
 * address is refused (fail closed).
 */
export function refusalReason(ip: string): string | null {
  const text = ip.trim();
  if (text.includes(':')) {
    const a = parseV6(text);
    return a === null ? `${JSON.stringify(text)} is not an IP address` : v6Reason(a, text);
  }
  const a = parseV4(text);
  return a === null ? `${JSON.stringify(text)} is not an IP address` : v4Reason(a);
}

/** True when a backend must not connect to this address. */
export function isRefusedAddress(ip: string): boolean {
  return refusalReason(ip) !== null;
}

export type HostLookup = (host: string, options: { all: true }) => Promise<readonly LookupAddress[]>;
export type HostVerdict = { ok: true; addresses: string[] } | { ok: false; reason: string };

function isLiteral(host: string): boolean {
  return host.includes(':') || parseV4(host) !== null;
}

/**
 * Judges a backend's host at creation. A literal IP is judged as is; a name is resolved
 * and refused if any of its addresses is refused, or if it resolves to none. `localhost`
 * names are refused without asking the resolver (RFC 6761: always loopback).
 */
export async function checkHostAllowed(
  host: string,
  lookup: HostLookup = dnsPromises.lookup,
): Promise<HostVerdict> {
  let h = host.trim().toLowerCase();
  if (h.startsWith('[') && h.endsWith(']')) h = h.slice(1, -1);
  if (h === '') return { ok: false, reason: 'the host is empty' };
  if (isLiteral(h)) {
    const reason = refusalReason(h);
    return reason === null ? { ok: true, addresses: [h] } : { ok: false, reason };
  }
  const name = h.endsWith('.') ? h.slice(0, -1) : h;
  if (name === 'localhost' || name.endsWith('.localhost')) {
    return { ok: false, reason: `${host} is a loopback name` };
  }
  let addresses: readonly LookupAddress[];
  try {
    addresses = await lookup(h, { all: true });
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    return { ok: false, reason: `${host} did not resolve${typeof code === 'string' ? ` (${code})` : ''}` };
  }
  if (addresses.length === 0) return { ok: false, reason: `${host} resolved to no address` };
  for (const a of addresses) {
    const reason = refusalReason(a.address);
    if (reason !== null) return { ok: false, reason: `${host} resolves to ${a.address}: ${reason}` };
  }
  return { ok: true, addresses: addresses.map((a) => a.address) };
}

function refusedError(hostname: string, reason: string): NodeJS.ErrnoException {
  return Object.assign(new Error(`backend host refused: ${hostname}: ${reason}`), {
    code: HOST_REFUSED_CODE,
    hostname,
  });
}

/**
 * Wraps a `dns.lookup`-style function for undici's `connect: { lookup }` (and net/tls):
 * the connect-time re-check. Resolves every address and calls back with an error whose
 * `code` is SARSEN_HOST_REFUSED when any is refused. Literal IPs never reach a lookup
 * function (net connects to them directly), so those rely on the creation-time check.
 */
export function policyLookup(baseLookup: LookupFunction = dnsLookup as LookupFunction): LookupFunction {
  return (hostname, options, callback) => {
    const opts = typeof options === 'object' && options !== null ? options : {};
    baseLookup(hostname, { ...opts, all: true }, (err, address, family) => {
      const wantAll = opts.all === true;
      if (err) {
        callback(err, wantAll ? [] : '');
        return;
      }
      const list: LookupAddress[] = Array.isArray(address)
        ? address
        : [{ address, family: family ?? (isIPv6(address) ? 6 : 4) }];
      if (list.length === 0) {
        callback(refusedError(hostname, 'resolved to no address'), wantAll ? [] : '');
        return;
      }
      for (const a of list) {
        const reason = refusalReason(a.address);
        if (reason !== null) {
          callback(refusedError(hostname, reason), wantAll ? [] : '');
          return;
        }
      }
      if (wantAll) callback(null, list);
      else callback(null, list[0].address, list[0].family);
    });
  };
}
