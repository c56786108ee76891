// A highly available PostgreSQL on this machine, from Debian's pg_auto_failover
// (postgresql-<version>-auto-failover): a monitor and two nodes with synchronous replication,
// each on a port of its own, data under a temporary directory, run as the `postgres` user
// (pg_autoctl refuses root). The monitor is tuned to notice a dead primary in about two seconds
// and to promote after five (docs/scaling.md says what the defaults are and why they are longer).
import fs from 'node:fs';
import os from 'node:os';
import net from 'node:net';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import pg from 'pg';
import { spawnProcess, type SarsenChild } from './child.ts';

export type HaNode = { name: string; port: number; pgdata: string; keeper: SarsenChild | null };

export type HaCluster = {
  /** `127.0.0.1:<port>,127.0.0.1:<port>`: CTX_DATABASE_HOST for the pair. */
  hosts: string;
  database: string;
  nodes: HaNode[];
  /** The node the monitor has as primary, once the pair is primary and secondary again. */
  healthy(timeoutMs?: number): Promise<HaNode>;
  /** Kills a node's keeper and its postmaster with SIGKILL (the node is lost). */
  kill(node: HaNode): void;
  /** Starts a killed node's keeper again: it rejoins as a standby. */
  restart(node: HaNode): void;
  /** Resolves at the moment `node` takes writes (promoted, no longer read-only). */
  writable(node: HaNode, timeoutMs?: number): Promise<number>;
  /** Stops the monitor: nothing promotes a standby until `startMonitor` (a failover held in its middle). */
  stopMonitor(): Promise<void>;
  /** Starts the monitor again; it promotes the standby of a primary it finds gone. */
  startMonitor(): Promise<void>;
  /** A planned switchover (pgautofailover.perform_failover): the secondary becomes primary, the primary secondary. */
  switchover(): Promise<void>;
  /**
   * Samples, every `everyMs`, each node's role and synchronous_standby_names and the monitor's
   * states, and keeps a line whenever one changes: what a failure message shows
   * of the manager's steps. `stop` ends the sampling and returns the lines.
   */
  watch(everyMs?: number): { stop(): Promise<string[]> };
  stop(): Promise<void>;
};

/** Where pg_auto_failover's binaries and PostgreSQL's are, or null when the package is missing. */
export function autoFailoverInstalled(): { bin: string; version: string } | null {
  const base = '/usr/lib/postgresql';
  if (!fs.existsSync('/usr/bin/pg_autoctl') || !fs.existsSync(base)) return null;
  const version = fs.readdirSync(base).find((v) => fs.existsSync(path.join(base, v, 'lib/pgautofailover.so')));
  return version ? { bin: path.join(base, version, 'bin'), version } : null;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until<T>(what: string, timeoutMs: number, fn: () => Promise<T | undefined>, everyMs = 100): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn().catch(() => undefined);
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`HA cluster: ${what} not reached within ${timeoutMs} ms`);
    await sleep(everyMs);
  }
}

async function query<T extends pg.QueryResultRow>(port: number, database: string, sql: string): Promise<T[]> {
  const c = new pg.Client({ host: '127.0.0.1', port, user: 'postgres', database, connectionTimeoutMillis: 2000 });
  c.on('error', () => undefined);
  try {
    await c.connect();
    return (await c.query<T>(sql)).rows;
  } finally {
    await c.end().catch(() => undefined);
  }
}

export async function startHaCluster(opts: { database?: string } = {}): Promise<HaCluster> {
  const installed = autoFailoverInstalled();
  if (!installed) throw new Error('pg_auto_failover is not installed: apt-get install postgresql-<version>-auto-failover (see .ci/run)');
  const database = opts.database ?? 'sarsen';
  const root = process.getuid?.() === 0;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-ha-'));
  if (root) execFileSync('chown', ['postgres:postgres', dir]);
  const env = { ...process.env, PATH: `${installed.bin}:${process.env.PATH}` };
  // As the postgres user when we are root.
  const command = (args: string[]): [string, string[]] => (root ? ['runuser', ['-u', 'postgres', '--', 'env', `PATH=${env.PATH}`, 'pg_autoctl', ...args]] : ['pg_autoctl', args]);
  const autoctl = (args: string[]) => {
    const [file, argv] = command(args);
    return execFileSync(file, argv, { env, cwd: dir, stdio: ['ignore', 'pipe', 'pipe'], timeout: 120_000 }).toString();
  };
  const keepers = new Set<SarsenChild>();
  const run = (pgdata: string): SarsenChild => {
    const [file, argv] = command(['run', '--pgdata', pgdata]);
    // A process group of its own: killing the node kills its keeper and its postmaster together.
    const keeper = spawnProcess(file, argv, { env, cwd: dir, detached: true, label: `pg_autoctl run ${path.basename(pgdata)}` });
    keepers.add(keeper);
    void keeper.exited.then(() => keepers.delete(keeper));
    return keeper;
  };
  const monitorPort = await freePort();
  let monitorKeeper: SarsenChild | null = null;
  const ports = [await freePort(), await freePort()];
  const monitorData = path.join(dir, 'monitor');
  const nodes: HaNode[] = ports.map((port, i) => ({ name: `node_${i + 1}`, port, pgdata: path.join(dir, `node${i + 1}`), keeper: null }));
  const states = async () =>
    query<{ nodename: string; nodeport: number; reportedstate: string; goalstate: string }>(
      monitorPort,
      'pg_auto_failover',
      'SELECT nodename, nodeport, reportedstate, goalstate FROM pgautofailover.node',
    );
  const stop = async () => {
    for (const pgdata of [...nodes.map((n) => n.pgdata), monitorData]) {
      if (fs.existsSync(pgdata)) {
        try {
          autoctl(['stop', '--pgdata', pgdata, '--immediate']);
        } catch {
          // already down
        }
      }
    }
    await sleep(500);
    for (const k of keepers) {
      if (k.child.pid) {
        try {
          process.kill(-k.child.pid, 'SIGKILL');
        } catch {
          // gone
        }
      }
      await k.exited;
    }
    fs.rmSync(dir, { recursive: true, force: true });
  };

  try {
    const common = ['--hostname', '127.0.0.1', '--auth', 'trust', '--no-ssl', '--listen', '127.0.0.1'];
    autoctl(['create', 'monitor', '--pgdata', monitorData, '--pgport', String(monitorPort), ...common]);
    monitorKeeper = run(monitorData);
    await until('monitor up', 30_000, async () => (await query(monitorPort, 'pg_auto_failover', 'SELECT 1')).length > 0 || undefined);
    // Notice a node gone within about two seconds; promote five seconds after (the keeper of a
    // cut-off primary demotes itself after three: see network_partition_timeout below).
    const tuning: [string, number][] = [
      ['health_check_period', 1000],
      ['health_check_timeout', 1000],
      ['health_check_max_retries', 1],
      ['health_check_retry_delay', 500],
      ['node_considered_unhealthy_timeout', 2000],
      ['primary_demote_timeout', 5000],
      // After the monitor (re)starts, it judges nodes' health this soon (default 10 s).
      ['startup_grace_period', 1000],
    ];
    for (const [name, value] of tuning) await query(monitorPort, 'pg_auto_failover', `ALTER SYSTEM SET pgautofailover.${name} = ${value}`);
    await query(monitorPort, 'pg_auto_failover', 'SELECT pg_reload_conf()');
    const monitor = `postgres://autoctl_node@127.0.0.1:${monitorPort}/pg_auto_failover?sslmode=disable`;
    for (const node of nodes) {
      autoctl(['create', 'postgres', '--pgdata', node.pgdata, '--pgport', String(node.port), '--name', node.name, '--dbname', database, '--monitor', monitor, ...common]);
      autoctl(['config', 'set', '--pgdata', node.pgdata, 'timeout.network_partition_timeout', '3']);
      node.keeper = run(node.pgdata);
      await until(`${node.name} registered`, 60_000, async () => {
        const s = (await states()).find((r) => r.nodename === node.name);
        return s && s.reportedstate === s.goalstate && ['single', 'primary', 'secondary'].includes(s.reportedstate) ? true : undefined;
      });
    }
  } catch (err) {
    await stop();
    throw err;
  }

  /** The monitor's view and the end of each keeper's log, for a failure message. */
  const describe = async () =>
    `monitor: ${JSON.stringify(await states().catch(() => null))}\n${nodes.map((n) => `${n.name}: ${n.keeper?.output().slice(-2500) ?? '(not running)'}`).join('\n')}`;

  const cluster: HaCluster = {
    hosts: nodes.map((n) => `127.0.0.1:${n.port}`).join(','),
    database,
    nodes,
    async healthy(timeoutMs = 90_000) {
      try {
        return await until('primary and secondary', timeoutMs, async () => {
          const s = await states();
          const primary = s.find((r) => r.reportedstate === 'primary' && r.goalstate === 'primary');
          const secondary = s.find((r) => r.reportedstate === 'secondary' && r.goalstate === 'secondary');
          return primary && secondary ? nodes.find((n) => n.name === primary.nodename) : undefined;
        }, 200);
      } catch (err) {
        throw new Error(`${(err as Error).message}; ${await describe()}`);
      }
    },
    kill(node) {
      const pid = node.keeper?.child.pid;
      if (!pid) throw new Error(`${node.name} has no keeper running`);
      process.kill(-pid, 'SIGKILL');
      node.keeper = null;
    },
    restart(node) {
      node.keeper = run(node.pgdata);
    },
    async writable(node, timeoutMs = 120_000) {
      try {
        return await until(`${node.name} writable`, timeoutMs, async () => {
          const [r] = await query<{ rw: boolean }>(node.port, database, `SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off' AS rw`);
          return r?.rw ? Date.now() : undefined;
        }, 25);
      } catch (err) {
        throw new Error(`${(err as Error).message}; ${await describe()}`);
      }
    },
    async stopMonitor() {
      const keeper = monitorKeeper;
      if (!keeper) throw new Error('the monitor is not running');
      autoctl(['stop', '--pgdata', monitorData]);
      await keeper.exited;
      monitorKeeper = null;
    },
    async startMonitor() {
      monitorKeeper = run(monitorData);
      await until('monitor up again', 30_000, async () => (await query(monitorPort, 'pg_auto_failover', 'SELECT 1')).length > 0 || undefined);
    },
    async switchover() {
      // pg_auto_failover 2.0's monitor reads a reporting node's row before it takes the group's
      // lock (NodeActive). A primary's keeper reporting while perform_failover runs then writes
      // its stale view back: the primary's goal `draining` becomes `wait_primary`, so it keeps
      // taking writes with no synchronous standby while the standby is promoted, and whatever it
      // acknowledges in those seconds is lost to every client (hapostgres/pg_auto_failover#774,
      // fixed upstream after 2.2). A keeper reports once a second when nothing changes, so the
      // failover is started just after the primary's report, far from its next one.
      const c = new pg.Client({ host: '127.0.0.1', port: monitorPort, user: 'postgres', database: 'pg_auto_failover' });
      c.on('error', () => undefined);
      await c.connect();
      try {
        const reported = async () =>
          (await c.query<{ nodename: string; at: string }>(`SELECT nodename, reporttime::text AS at FROM pgautofailover.node WHERE reportedstate = 'primary' AND goalstate = 'primary'`)).rows[0];
        const before = await reported();
        if (!before) throw new Error(`HA cluster: no stable primary to switch over from; ${await describe()}`);
        await until('the primary\'s next report', 5000, async () => ((await reported())?.at !== before.at ? true : undefined), 5);
        // (By event id: a racing report's transaction, and so its events' time, began before this call.)
        const since = (await c.query<{ id: string }>('SELECT coalesce(max(eventid), 0)::text AS id FROM pgautofailover.event')).rows[0]!.id;
        await c.query(`SELECT pgautofailover.perform_failover('default', 0)`);
        const standby = nodes.find((n) => n.name !== before.nodename)!;
        await until('the standby promoted', 120_000, async () => {
          const s = await states();
          return s.some((r) => r.nodename === standby.name && r.reportedstate === 'primary') ? true : undefined;
        });
        // Had the race happened anyway, say so here rather than only through what was lost.
        const { rows } = await c.query<{ description: string }>(
          `SELECT description FROM pgautofailover.event WHERE eventid > $1::bigint AND goalstate = 'wait_primary' AND nodename = $2`,
          [since, before.nodename],
        );
        if (rows.length) throw new Error(`HA cluster: the monitor gave the old primary wait_primary during the switchover (pg_auto_failover#774): ${rows.map((r) => r.description).join('; ')}`);
      } finally {
        await c.end().catch(() => undefined);
      }
    },
    watch(everyMs = 200) {
      const lines: string[] = [];
      const last = new Map<string, string>();
      const t0 = Date.now();
      const note = (who: string, what: string) => {
        if (last.get(who) === what) return;
        last.set(who, what);
        lines.push(`+${Date.now() - t0} ms ${who}: ${what}`);
      };
      let running = true;
      const loop = (async () => {
        while (running) {
          await Promise.all([
            states().then(
              (s) => note('monitor', s.map((r) => `${r.nodename} ${r.reportedstate}->${r.goalstate}`).sort().join(', ')),
              (e: Error) => note('monitor', `(${e.message})`),
            ),
            ...nodes.map((n) =>
              query<{ standby: boolean; sync: string }>(
                n.port,
                database,
                `SELECT pg_is_in_recovery() AS standby, current_setting('synchronous_standby_names') AS sync`,
              ).then(
                ([r]) => note(n.name, r ? `${r.standby ? 'standby' : 'primary'} sync='${r.sync}'` : '(no row)'),
                (e: Error) => note(n.name, `(${e.message.slice(0, 80)})`),
              ),
            ),
          ]);
          await sleep(everyMs);
        }
      })();
      return {
        async stop() {
          running = false;
          await loop;
          return lines;
        },
      };
    },
    stop,
  };
  return cluster;
}
