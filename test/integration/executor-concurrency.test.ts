// `--executor-concurrency 1`: graphile-worker's own pool was bounded by the concurrency, so its
// LISTEN client held the only connection and no job was ever fetched.
import { expect } from 'chai';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision } from '../support/tenant.ts';
import { startDeployment, type Deployment } from '../support/processes.ts';
import { spawnSarsen, sarsenEnv } from '../support/child.ts';
import { rawRequest, json, until } from '../support/http.ts';

describe('an executor of concurrency 1', function () {
  this.timeout(60_000);
  let provider: FakeProvider;
  let d: Deployment;
  before(async () => {
    provider = await startFakeProvider();
    d = await startDeployment();
  });
  after(async () => {
    await d?.close();
    await provider?.close();
  });

  it('runs what is submitted, one at a time', async () => {
    const api = await d.start('api');
    const executor = spawnSarsen(['--role', 'executor', '--port', '0', '--executor-concurrency', '1'], sarsenEnv(d.db.conn, d.secrets.dir));
    try {
      await executor.waitFor(/"executor started"/);
      const t = await provision(d.asServer(api), provider);
      const ids: string[] = [];
      for (const content of ['one', 'two', 'three']) {
        const res = await rawRequest(`${t.base}/requests`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
          body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content }] }),
        });
        expect(res.status).to.equal(202);
        ids.push(json(res).request_id);
      }
      const done = () => d.pool.query(`SELECT count(*)::int AS n FROM sarsen.requests WHERE id = ANY($1) AND status = 'succeeded'`, [ids]);
      await until(async () => ((await done()).rows[0].n === ids.length ? true : undefined), 30_000);
    } finally {
      await executor.kill('SIGTERM');
      await api.kill('SIGTERM');
    }
  });
});
