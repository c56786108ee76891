// Policy behind `422 backend_host_refused` (SPEC.md Errors; DESIGN.md "Submissions and
// records"): with `backends_public_only` on, a backend may not point into the deployment's
// own network. The host is judged when the backend is created and again at connect time,
// because a name may resolve elsewhere later.
//
// IPv6 addresses that carry an IPv4 address (mapped, compatible, SIIT, NAT64, 6to4) are
// judged by the address they carry, so `::ffff:127.0.0.1` is as refused as `127.0.0.1`.
import { lookup as dnsLookup, promises as dnsPromises } from 'node:dns';
import type { LookupAddress } from 'node:dns';
import { isIPv6 } from 'node:net';
import type { LookupFunction } from 'node:net';

export const HOST_REFUSED_CODE = 'SARSEN_HOST_REFUSED';

type V4Range = { base: number; bits: number; label: string };
type V6Range = { prefix: number[]; bits: number; label: string };

function v4(a: number, b: number, c: number, d: number, bits: number, label: string): V4Range {
  return { base: ((a << 24) | (b << 16) | (c << 8) | d) >>> 0, bits, label };
}

const V4_REFUSED: readonly V4Range[] = [
  v4(255, 255, 255, 255, 32, 'broadcast'),
  v4(0, 0, 0, 0, 8, 'unspecified'),
  v4(10, 0, 0, 0, 8, 'private'),
  v4(100, 64, 0, 0, 10, 'shared (CGNAT)'),
  v4(127, 0, 0, 0, 8, 'loopback'),
  v4(169, 254, 0, 0, 16, 'link-local'),
  v4(172, 16, 0, 0, 12, 'private'),
  v4(192, 0, 0, 0, 24, 'reserved (IETF protocol assignments)'),
  v4(192, 168, 0, 0, 16, 'private'),
  v4(198, 18, 0, 0, 15, 'reserved (benchmarking)'),
  v4(224, 0, 0, 0, 4, 'multicast'),
  v4(240, 0, 0, 0, 4, 'reserved'),
];

// Prefixes as 16-bit groups; ranges whose verdict comes from an embedded IPv4 address
// are handled in v6Reason, not here.
const V6_REFUSED: readonly V6Range[] = [
  { prefix: [0, 0, 0, 0, 0, 0, 0, 0], bits: 128, label: 'unspecified' },
  { prefix: [0, 0, 0, 0, 0, 0, 0, 1], bits: 128, label: 'loopback' },
  { prefix: [0x64, 0xff9b, 1], bits: 48, label: 'private (local-use NAT64)' },
  { prefix: [0xfc00], bits: 7, label: 'private (unique local)' },
  { prefix: [0xfe80], bits: 10, label: 'link-local' },
  { prefix: [0xfec0], bits: 10, label: 'private (site-local)' },
  { prefix: [0xff00], bits: 8, label: 'multicast' },
];

// Where an IPv4 address sits inside an IPv6 one: prefix groups and the group index of its
// first half.
const V6_EMBEDDINGS: readonly { prefix: number[]; bits: number; at: number; name: string }[] = [
  { prefix: [0, 0, 0, 0, 0, 0xffff], bits: 96, at: 6, name: 'v4-mapped' },
  { prefix: [0, 0, 0, 0, 0xffff, 0], bits: 96, at: 6, name: 'v4-translated' },
  { prefix: [0, 0, 0, 0, 0, 0], bits: 96, at: 6, name: 'v4-compatible' },
  { prefix: [0x64, 0xff9b, 0, 0, 0, 0], bits: 96, at: 6, name: 'NAT64' },
  { prefix: [0x2002], bits: 16, at: 1, name: '6to4' },
];

/**
 * IPv4 in any form the URL parser and inet_aton accept: 1 to 4 parts, each decimal,
 * octal (leading 0) or hex (0x), the last part filling the remaining bytes. `127.1`
 * and `0x7f000001` are both loopback to the resolver, so they must be to us too.
 */
export function parseIPv4(s: string): number | null {
  const parts = s.split('.');
  if (parts.length > 1 && parts[parts.length - 1] === '') parts.pop();
  if (parts.length === 0 || parts.length > 4) return null;
  const nums: number[] = [];
  for (const part of parts) {
    let n: number;
    if (/^0[xX][0-9a-fA-F]*$/.test(part)) n = part.length === 2 ? 0 : parseInt(part.slice(2), 16);
    else if (/^0[0-7]+$/.test(part)) n = parseInt(part.slice(1), 8);
    else if (/^(0|[1-9][0-9]*)$/.test(part)) n = Number(part);
    else return null;
    if (!Number.isSafeInteger(n)) return null;
    nums.push(n);
  }
  const last = nums.pop() as number;
  if (nums.some((n) => n > 255) || last >= 256 ** (4 - nums.length)) return null;
  let value = last;
  nums.forEach((n, i) => { value += n * 256 ** (3 - i); });
  return value >>> 0;
}

/** IPv6 text (zero compression, embedded IPv4 tail, zone id) to eight 16-bit groups. */
export function parseIPv6(s: string): number[] | null {
  const zone = s.indexOf('%');
  const text = zone >= 0 ? s.slice(0, zone) : s;
  if (zone >= 0 && zone === s.length - 1) return null;
  const halves = text.split('::');
  if (halves.length > 2) return null;
  const toGroups = (part: string, allowV4Tail: boolean): number[] | null => {
    if (part === '') return [];
    const fields = part.split(':');
    const groups: number[] = [];
    for (let i = 0; i < fields.length; i++) {
      const f = fields[i];
      if (allowV4Tail && i === fields.length - 1 && f.includes('.')) {
        if (!/^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/.test(f)) return null;
        const [a, b, c, d] = f.split('.').map(Number);
        groups.push((a << 8) | b, (c << 8) | d);
      } else if (/^[0-9a-fA-F]{1,4}$/.test(f)) {
        groups.push(parseInt(f, 16));
      } else {
        return null;
      }
    }
    return groups;
  };
  if (halves.length === 1) {
    const groups = toGroups(text, true);
    return groups !== null && groups.length === 8 ? groups : null;
  }
  const head = toGroups(halves[0], false);
  const tail = toGroups(halves[1], true);
  if (head === null || tail === null || head.length + tail.length > 7) return null;
  return [...head, ...new Array<number>(8 - head.length - tail.length).fill(0), ...tail];
}

function v4Text(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

function v4Reason(n: number): string | null {
  for (const r of V4_REFUSED) {
    const mask = r.bits === 0 ? 0 : (~0 << (32 - r.bits)) >>> 0;
    if (((n & mask) >>> 0) === r.base) return `${v4Text(n)} is a ${r.label} address`;
  }
  return null;
}

function v6HasPrefix(groups: readonly number[], prefix: readonly number[], bits: number): boolean {
  for (let i = 0; i * 16 < bits; i++) {
    const take = Math.min(16, bits - i * 16);
    const mask = (0xffff << (16 - take)) & 0xffff;
    if ((groups[i] & mask) !== ((prefix[i] ?? 0) & mask)) return false;
  }
  return true;
}

function v6Reason(groups: readonly number[], text: string): string | null {
  for (const r of V6_REFUSED) {
    if (v6HasPrefix(groups, r.prefix, r.bits)) return `${text} is a ${r.label} address`;
  }
  for (const e of V6_EMBEDDINGS) {
    if (!v6HasPrefix(groups, e.prefix, e.bits)) continue;
    const inner = ((groups[e.at] << 16) | groups[e.at + 1]) >>> 0;
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
    const groups = parseIPv6(text);
    return groups === null ? `${JSON.stringify(text)} is not an IP address` : v6Reason(groups, text);
  }
  const n = parseIPv4(text);
  return n === null ? `${JSON.stringify(text)} is not an IP address` : v4Reason(n);
}

/** True when a backend must not connect to this address. */
export function isRefusedAddress(ip: string): boolean {
  return refusalReason(ip) !== null;
}

export type HostLookup = (host: string, options: { all: true }) => Promise<readonly LookupAddress[]>;
export type HostVerdict = { ok: true; addresses: string[] } | { ok: false; reason: string };

function isLiteral(host: string): boolean {
  return host.includes(':') || parseIPv4(host) !== null;
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
