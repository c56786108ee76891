// Several database hosts (libpq's multi-host `CTX_DATABASE_HOST`, with what libpq calls
// target_session_attrs=read-write): every connection goes to the one host that takes writes.
// node-postgres knows one host per client, so a client subclass asks a per-process resolver for
// the writable host before it connects. The resolver remembers it until a connection to it is
// lost or finds it read-only, then probes every host at once and takes the first that is
// writable. A server reports `in_hot_standby` and `default_transaction_read_only` when a session
// starts and whenever they change (PostgreSQL 14 and later), so the check costs no query.
//
// While only read-only standbys answer (a failover under way), connecting fails with a
// connection-class error (SQLSTATE 08001): every part of Sarsen already rides that out as it
// rides out a restart, and /readyz answers 503. Nothing is ever written to a standby. How a
// process that starts meanwhile waits is in startup.ts.
import pg from 'pg';
import { parseHosts, formatHost, type HostPort } from '../core/hosts.ts';
import { logger } from '../log.ts';

type Plain = Readonly<{ host: string; port: number; user: string; database: string; password?: string }>;

const PROBE_TIMEOUT_MS = 5_000;
const END_WAIT_MS = 1_000;

/** No host takes writes now: each refused the connection, or is a standby (or read-only). */
export class NoWritableHost extends Error {
  override name = 'NoWritableHost';
  readonly code = '08001'; // sqlclient_unable_to_establish_sqlconnection: a connection loss to every caller
}

/** Logged once while only standbys answer, by a running process and by one starting. */
export const STANDBYS_ONLY = 'only read-only standbys answer; waiting for a writable primary, writing nothing meanwhile';

type Resolver = { target(): Promise<HostPort>; lost(h: HostPort): void };
const resolvers = new Map<string, Resolver>();

const readOnly = (status: ReadonlyMap<string, string>): boolean | null => {
  const standby = status.get('in_hot_standby');
  if (standby === undefined) return null; // a server before 14 does not say: ask it
  return standby === 'on' || status.get('default_transaction_read_only') === 'on';
};

/** Whether a connected client's server takes writes (by what it reported, else by asking). */
async function writable(client: pg.Client, status: ReadonlyMap<string, string>): Promise<boolean> {
  const reported = readOnly(status);
  if (reported !== null) return !reported;
  const { rows } = await client.query<{ ro: boolean }>(`SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on' AS ro`);
  return !rows[0]!.ro;
}

function watchStatus(client: pg.Client): Map<string, string> {
  const status = new Map<string, string>();
  client.connection.on('parameterStatus', (m: { parameterName: string; parameterValue: string }) => status.set(m.parameterName, m.parameterValue));
  return status;
}

/** What a host is now; `unreachable` keeps why (a refused password is not an outage). */
export type Probe = { host: HostPort } & ({ state: 'writable' | 'read-only' } | { state: 'unreachable'; err: unknown });

/** What one host is now. Bounded: a host that accepts a connection and then says nothing counts as unreachable. */
async function probe(conn: Plain, h: HostPort): Promise<Probe> {
  const client = new pg.Client({ ...conn, host: h.host, port: h.port, application_name: 'sarsen-probe' });
  client.on('error', () => undefined);
  const status = watchStatus(client);
  const cut = () => client.connection.stream.destroy();
  const timer = setTimeout(cut, PROBE_TIMEOUT_MS);
  try {
    await client.connect();
    return { host: h, state: (await writable(client, status)) ? 'writable' : 'read-only' };
  } catch (err) {
    return { host: h, state: 'unreachable', err };
  } finally {
    clearTimeout(timer);
    // A goodbye, without waiting on a server that may never answer it.
    void client.end().catch(() => undefined);
    setTimeout(cut, END_WAIT_MS).unref();
  }
}

function createResolver(conn: Plain, hosts: readonly HostPort[]): Resolver {
  let current: HostPort | null = null;
  let known: HostPort | null = null; // the last writable host found, for the log
  let probing: Promise<HostPort> | null = null;
  let waitingLogged = false;
  const all = hosts.map(formatHost).join(',');

  const find = (): Promise<HostPort> =>
    new Promise((resolve, reject) => {
      const results: Probe['state'][] = [];
      let settled = false;
      for (const h of hosts) {
        void probe(conn, h).then(({ state: result }) => {
          results.push(result);
          if (settled) return;
          if (result === 'writable') {
            settled = true;
            return resolve(h);
          }
          if (results.length < hosts.length) return;
          settled = true;
          const standbys = results.filter((r) => r === 'read-only').length;
          if (standbys > 0 && !waitingLogged) {
            waitingLogged = true;
            logger.warn(STANDBYS_ONLY, { hosts: all });
          }
          reject(new NoWritableHost(standbys > 0 ? `no writable database host: ${all} answer only as read-only standbys` : `no database host answers: ${all}`));
        });
      }
    });

  return {
    target() {
      if (current) return Promise.resolve(current);
      probing ??= find().then(
        (h) => {
          probing = null;
          current = h;
          waitingLogged = false;
          if (!known || formatHost(known) !== formatHost(h)) logger.info('writable database host found', { host: formatHost(h), hosts: all });
          known = h;
          return h;
        },
        (err: unknown) => {
          probing = null;
          throw err;
        },
      );
      return probing;
    },
    lost(h) {
      if (current && current.host === h.host && current.port === h.port) current = null;
    },
  };
}

function resolverFor(conn: Plain, hosts: readonly HostPort[]): Resolver {
  const key = `${conn.user}@${conn.host}/${conn.database}`;
  let r = resolvers.get(key);
  if (!r) resolvers.set(key, (r = createResolver(conn, hosts)));
  return r;
}

/**
 * The pg client class for `conn` when it names several hosts (null for one: it is connected to
 * as it always was). The class connects to the writable host and hands a lost or read-only one
 * back to the resolver.
 */
export function writableClient(conn: Plain): typeof pg.Client | null {
  const hosts = parseHosts(conn.host, conn.port);
  if (hosts.length === 1) return null;
  const resolver = resolverFor(conn, hosts);
  return class WritableClient extends pg.Client {
    override connect(): Promise<pg.Client>;
    override connect(callback: ((err: Error) => void) | ((err: null, c: pg.Client) => void)): void;
    override connect(callback?: ((err: Error) => void) | ((err: null, c: pg.Client) => void)): Promise<pg.Client> | void {
      const connected = this.connectWritable();
      if (!callback) return connected;
      const done = callback as (err: Error | null, c?: pg.Client) => void;
      connected.then((c) => done(null, c), (err: Error) => done(err));
    }

    private async connectWritable(): Promise<pg.Client> {
      // Listened to from the start: until the pool's own listener is attached (after this
      // resolves) a server going away would otherwise crash the process, as one did in a
      // failover test: a demoted host's postmaster exiting while this client was being ended.
      let chosen: HostPort | null = null;
      this.on('error', () => {
        if (chosen) resolver.lost(chosen);
      });
      const target = (chosen = await resolver.target());
      // A pool that gave up on this connection meanwhile has destroyed its socket.
      if (this.connection.stream.destroyed) throw new Error('timeout exceeded when trying to connect');
      const params = (this as unknown as { connectionParameters: { host: string; port: number } }).connectionParameters;
      this.host = params.host = target.host;
      this.port = params.port = target.port;
      const status = watchStatus(this);
      try {
        await super.connect();
      } catch (err) {
        resolver.lost(target);
        throw err;
      }
      if (!(await writable(this, status).catch(() => false))) {
        resolver.lost(target);
        await this.end().catch(() => undefined);
        throw new NoWritableHost(`${formatHost(target)} no longer takes writes`);
      }
      // The server turning read-only under this session (a later loss: the listener above): look again next time.
      this.connection.on('parameterStatus', () => {
        if (readOnly(status)) resolver.lost(target);
      });
      return this;
    }
  };
}

/** What every host `conn` names is now, each probed afresh, all at once (one host as well as several). */
export function surveyHosts(conn: Plain): Promise<Probe[]> {
  return Promise.all(parseHosts(conn.host, conn.port).map((h) => probe(conn, h)));
}

/** The host a single-host `conn` names, with its own port when it gives one (`host:port`). */
export function singleHost(conn: Plain): Plain {
  const hosts = parseHosts(conn.host, conn.port);
  return hosts.length === 1 ? { ...conn, host: hosts[0]!.host, port: hosts[0]!.port } : conn;
}
