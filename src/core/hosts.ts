// Database hosts as libpq writes them: `CTX_DATABASE_HOST` may name several, comma-separated,
// each with its own port (`10.0.0.1:5432,10.0.0.2:5433`, `[::1]:5432`); a host without one takes
// the default port. A path (a Unix socket directory) takes no port of its own.

export type HostPort = Readonly<{ host: string; port: number }>;

export class HostListError extends Error {
  override name = 'HostListError';
}

function portOf(text: string, entry: string): number {
  if (!/^\d{1,5}$/.test(text) || Number(text) < 1 || Number(text) > 65535) throw new HostListError(`bad port in ${JSON.stringify(entry)}`);
  return Number(text);
}

/** The hosts `list` names, in order. Throws HostListError on an empty entry or a bad port. */
export function parseHosts(list: string, defaultPort: number): HostPort[] {
  return list.split(',').map((raw) => {
    const entry = raw.trim();
    if (entry === '') throw new HostListError(`empty host in ${JSON.stringify(list)}`);
    if (entry.startsWith('/')) return { host: entry, port: defaultPort };
    if (entry.startsWith('[')) {
      const close = entry.indexOf(']');
      if (close < 0) throw new HostListError(`unclosed [ in ${JSON.stringify(entry)}`);
      const rest = entry.slice(close + 1);
      if (rest !== '' && !rest.startsWith(':')) throw new HostListError(`unexpected text after ] in ${JSON.stringify(entry)}`);
      return { host: entry.slice(1, close), port: rest === '' ? defaultPort : portOf(rest.slice(1), entry) };
    }
    const colon = entry.indexOf(':');
    // More than one colon without brackets: a bare IPv6 address, which takes the default port.
    if (colon < 0 || entry.indexOf(':', colon + 1) >= 0) return { host: entry, port: defaultPort };
    return { host: entry.slice(0, colon), port: portOf(entry.slice(colon + 1), entry) };
  });
}

/** `host:port` for logs and messages (brackets around an IPv6 address). */
export function formatHost(h: HostPort): string {
  return h.host.startsWith('/') ? h.host : `${h.host.includes(':') ? `[${h.host}]` : h.host}:${h.port}`;
}

/**
 * Whether a database host is this machine: a Unix socket directory, `localhost` or a loopback
 * address. A PostgreSQL there shares this machine's cores with Sarsen.
 */
export function isLocalHost(host: string): boolean {
  return host.startsWith('/') || host === 'localhost' || host === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}
