import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { testPool } from '../support/db.ts';
import { setSetting, parseSettings, SETTING_SCHEMAS } from '../../src/config/settings.ts';
import { loadSettings } from '../../src/db/settings.ts';
import { withTransaction } from '../../src/db/pool.ts';

async function eventually(check: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error('condition not reached in time');
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('settings', () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
  });

  it('seeds every setting with its documented default, each valid, and no other', async () => {
    const raw = await loadSettings(server.pool);
    expect(Object.keys(raw).sort()).to.deep.equal(Object.keys(SETTING_SCHEMAS).sort());
    const defaults = { ...raw, backends_public_only: true }; // the harness turns it off for tests
    expect(parseSettings(defaults)).to.include({
      synchronous_hold_ms: 300_000,
      idempotency_window_ms: 600_000,
      lease_ms: 30_000,
      heartbeat_ms: 10_000,
      sweep_interval_ms: 2000,
      max_attempts: 3,
      retry_base_ms: 1000,
      retry_max_ms: 60_000,
      shutdown_grace_ms: 30_000,
      upstream_connect_timeout_ms: 10_000,
      upstream_headers_timeout_ms: 600_000,
      upstream_idle_timeout_ms: 300_000,
      database_deadline_ms: 10_000,
      metadata_horizon_minutes: 129_600,
      listing_horizon_days: 400,
      ledger_horizon_days: 2557,
      reroute_ceiling: 5,
      metering_enabled: false,
      request_fee_micros: 0,
    });
  });

  it('a running process sees a changed setting through the bus, without restarting', async () => {
    expect(server.settings.current().max_attempts).to.equal(3);
    const pool = testPool(server.db.conn);
    try {
      await setSetting(pool, 'max_attempts', '7');
      await eventually(() => server.settings.current().max_attempts === 7);
      await setSetting(pool, 'max_attempts', '3');
      await eventually(() => server.settings.current().max_attempts === 3);
    } finally {
      await pool.end();
    }
  });

  it('re-reads after the bus connection is lost (NOTIFY is not replayed)', async () => {
    const pool = testPool(server.db.conn);
    const heard: string[] = [];
    const unsubscribe = [
      server.bus.subscribe('settings', () => heard.push('settings')),
      server.bus.subscribe('probe', () => heard.push('probe')),
    ];
    const busPids = async () =>
      (await pool.query<{ pid: number }>(
        `SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'sarsen-bus %' AND datname = current_database()`,
      )).rows.map((r) => r.pid);
    try {
      const listening = await busPids();
      expect(listening, 'the process has a bus connection').to.have.length.greaterThan(0);
      // A change no notification announces (triggers off for this transaction only), so only a
      // re-read after the reconnect can find it. A probe sent after it arrives after any
      // notification the change could have sent: there was none.
      await withTransaction(pool, async (tx) => {
        await tx.query('SET LOCAL session_replication_role = replica');
        await tx.query(`UPDATE sarsen.settings SET value = '9' WHERE name = 'max_attempts'`);
      });
      await pool.query(`SELECT pg_notify('sarsen_events', '{"k":"probe"}')`);
      await eventually(() => heard.includes('probe'));
      expect(heard, 'no notification of the silent change').to.deep.equal(['probe']);
      expect(server.settings.current().max_attempts).to.equal(3);
      // Kill the bus's LISTEN connection; the reconnect must re-read.
      const { rows } = await pool.query<{ killed: boolean }>('SELECT pg_terminate_backend(pid) AS killed FROM unnest($1::int[]) AS pid', [listening]);
      expect(rows.map((r) => r.killed), 'the bus connections were killed').to.deep.equal(listening.map(() => true));
      await eventually(() => server.settings.current().max_attempts === 9);
      const now = await busPids();
      expect(now.filter((pid) => listening.includes(pid)), 'none of the killed connections is left').to.deep.equal([]);
      expect(now, 'the bus is connected again').to.have.length.greaterThan(0);
    } finally {
      for (const off of unsubscribe) off();
      await pool.query(`UPDATE sarsen.settings SET value = '3' WHERE name = 'max_attempts'`);
      await pool.end();
    }
  });
});
