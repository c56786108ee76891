// What an idle process costs its database (docs/scaling.md "An idle process"): Sarsen processes
// with both roles, no traffic and no batches, on a fresh database, counted by PostgreSQL itself
// (pg_stat_database's commits and rollbacks over a window). On a server of the test's own: a
// LISTENing backend runs a transaction whenever it is made to catch up with NOTIFYs sent in other
// databases of its server, and the shared test server has other suites' traffic. One process stays near one
// transaction a second, and three more add little: the loops look often only while work runs,
// and one sweeper (the watching executor) does each sweep. The bounds are generous on purpose:
// they tell a design that polls (twenty transactions a second a process) from one that does not,
// not one machine's figures from another's.
import { expect } from 'chai';
import { setTimeout as sleep } from 'node:timers/promises';
import { testPool, type TestDatabase } from '../support/db.ts';
import { startOwnedPostgres, type OwnedPostgres } from '../support/owned-postgres.ts';
import { makeSecretsDir, type SecretsDir } from '../support/child.ts';
import { startProcess, type FleetProcess } from '../support/fleet.ts';

// Long enough to hold several of every pace but the slowest sweeps (once a minute).
const WINDOW_MS = 30_000;
// After starting: the startup statements and a new watcher's first sweep are behind it.
const SETTLE_MS = 10_000;
const ONE_PROCESS_AT_MOST = 1.5; // transactions a second
const EACH_MORE_AT_MOST = 0.6;

describe('an idle process', function () {
  this.timeout(180_000);
  let server: OwnedPostgres;
  let db: TestDatabase;
  let secrets: SecretsDir;
  // On the server's own database, so that reading the figures is not counted in them.
  let admin: ReturnType<typeof testPool>;
  const procs: FleetProcess[] = [];

  before(async () => {
    server = await startOwnedPostgres();
    db = await server.database('sarsen_idle');
    secrets = makeSecretsDir(db.conn);
    admin = testPool(server.admin, 1);
    // Autovacuum's first look at a new database's tables is not the processes' cost.
    const analyse = testPool(db.conn, 1);
    await analyse.query('VACUUM ANALYZE').finally(() => analyse.end());
  });
  afterEach(async () => {
    await Promise.all(procs.map((p) => p.kill('SIGKILL')));
  });
  after(async () => {
    await admin?.end();
    secrets?.remove();
    await server?.close();
  });

  /** Transactions a second on the test database over WINDOW_MS. */
  const rate = async (): Promise<number> => {
    const count = async () => {
      const { rows } = await admin.query<{ n: string }>(
        `SELECT (xact_commit + xact_rollback)::text AS n FROM pg_stat_database WHERE datname = $1`,
        [db.conn.database],
      );
      return { n: Number(rows[0]!.n), at: performance.now() };
    };
    const from = await count();
    await sleep(WINDOW_MS);
    const to = await count();
    return (to.n - from.n) / ((to.at - from.at) / 1000);
  };

  it('costs about a transaction a second, and three more processes add little to it', async () => {
    procs.push(await startProcess(db.conn, secrets.dir, 'both'));
    await sleep(SETTLE_MS);
    const one = await rate();
    expect(one, 'transactions a second, one idle process').to.be.at.most(ONE_PROCESS_AT_MOST);

    procs.push(...(await Promise.all([1, 2, 3].map(() => startProcess(db.conn, secrets.dir, 'both')))));
    await sleep(SETTLE_MS);
    const four = await rate();
    process.stderr.write(`      (transactions a second: one idle process ${one.toFixed(2)}, four ${four.toFixed(2)})\n`);
    expect(four - one, `transactions a second that three more idle processes add (one: ${one.toFixed(2)}, four: ${four.toFixed(2)})`).to.be.at.most(3 * EACH_MORE_AT_MOST);
  });
});
