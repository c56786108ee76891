// Database faults under load (issue 6): every server-side connection is killed mid-load, more
// than once; the process reconnects, the bus re-listens, and no accepted request is lost.
import { expect } from 'chai';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { startTestServer, type TestServer } from '../support/server.ts';
import { provision } from '../support/tenant.ts';
import { testPool } from '../support/db.ts';
import { recordingProvider, submitMixed, expectNothingLost, settled } from '../support/chaos.ts';

describe('database connections killed under load', function () {
  this.timeout(180_000);
  let provider: FakeProvider;
  let server: TestServer;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer({ settings: { sweep_interval_ms: 100, lease_ms: 3000, heartbeat_ms: 500 } });
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });

  it('loses no accepted request when every connection is terminated three times mid-load', async () => {
    const t = await provision(server, provider);
    const answers = recordingProvider(provider);
    const pool = testPool(server.db.conn, 2);
    try {
      let loading = true;
      let kills = 0;
      const chaos = (async () => {
        while (loading && kills < 3) {
          await new Promise((r) => setTimeout(r, 1200));
          const { rowCount } = await pool.query(
            `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`,
          );
          if (rowCount) kills++;
        }
      })();
      const { ok, refused } = await submitMixed(t, 200, 6, 'dbfault', 100);
      loading = false;
      await chaos;
      expect(kills).to.equal(3);
      expect(ok.length).to.be.greaterThan(150); // submissions caught by a kill may be refused (500), never lost
      await settled(pool, ok.map((s) => s.id), 90_000);
      await expectNothingLost(pool, t, ok, answers);
      process.stderr.write(`      (${ok.length} accepted, ${refused} refused while connections died)\n`);
      // The process is healthy afterwards: a new request runs normally.
      const after = await fetch(`${t.base}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
        body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: 'after the storm' }] }),
      });
      expect(after.status).to.equal(200);
    } finally {
      await pool.end();
    }
  });
});
