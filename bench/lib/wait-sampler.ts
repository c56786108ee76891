// What the database's backends are doing under load, sampled from pg_stat_activity every few
// milliseconds: on CPU, waiting on a lock (and in which statement), or idle in a transaction
// waiting for the application's next statement.
import pg from 'pg';
import type { ConnectionConfig } from '../../src/db/pool.ts';

export type WaitSample = { state: string; wait: string; query: string };
export type WaitReport = { samples: number; byState: [string, number][]; lockWaitsBy: [string, number][] };

export type WaitSampler = { stop(): Promise<WaitReport> };

function label(row: { state: string | null; wait_event_type: string | null; wait_event: string | null }): string {
  const state = row.state ?? '?';
  if (state === 'active' && !row.wait_event_type) return 'active, on CPU (no wait event)';
  const wait = row.wait_event_type ? `${row.wait_event_type}:${row.wait_event}` : 'no wait event';
  return `${state}, ${wait}`;
}

/** Samples the client backends of `database` (other than its own) until stopped. */
export async function startWaitSampler(conn: ConnectionConfig, database: string, everyMs = 10): Promise<WaitSampler> {
  const client = new pg.Client({ ...conn, application_name: 'sarsen-bench-waits' });
  client.on('error', () => undefined);
  await client.connect();
  const byState = new Map<string, number>();
  const lockWaits = new Map<string, number>();
  let samples = 0;
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      const { rows } = await client.query(
        `SELECT state, wait_event_type, wait_event, left(regexp_replace(query, '\\s+', ' ', 'g'), 60) AS query,
                (SELECT string_agg(l.locktype || coalesce(' ' || l.relation::regclass::text, '')
                                   || coalesce(' class ' || l.classid::regclass::text, ''), ',')
                   FROM pg_locks l WHERE l.pid = a.pid AND NOT l.granted) AS awaited
           FROM pg_stat_activity a
          WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'
            AND application_name NOT LIKE 'sarsen-bus %' AND state IS DISTINCT FROM 'idle'`,
        [database],
      );
      samples++;
      for (const r of rows) {
        const l = label(r);
        byState.set(l, (byState.get(l) ?? 0) + 1);
        if (r.wait_event_type === 'Lock' || r.wait_event_type === 'LWLock') {
          const k = `${r.wait_event_type}:${r.wait_event}${r.awaited ? ` (${r.awaited})` : ''} in ${r.query}`;
          lockWaits.set(k, (lockWaits.get(k) ?? 0) + 1);
        }
      }
      await new Promise((resolve) => setTimeout(resolve, everyMs));
    }
  })();
  return {
    async stop() {
      stopped = true;
      await loop.catch(() => undefined);
      await client.end().catch(() => undefined);
      const sort = (m: Map<string, number>) => [...m].sort((a, b) => b[1] - a[1]);
      return { samples, byState: sort(byState), lockWaitsBy: sort(lockWaits).slice(0, 10) };
    },
  };
}
