// The one fault waiting cannot heal (issue 14): the database answers but Sarsen's schema is
// gone. The process says so in one line and exits 1, for its deployment to restart it (a
// restart applies the migrations again); every other fault is ridden out (db-outage.test.ts).
import { expect } from 'chai';
import { startDeployment, type Deployment } from '../support/processes.ts';

describe('a schema that disappears', function () {
  this.timeout(60_000);
  let d: Deployment;
  before(async () => {
    d = await startDeployment();
  });
  after(async () => {
    await d?.close();
  });

  it('stops the process with exit code 1 and one error line naming the cause', async () => {
    const p = await d.start('both');
    try {
      await dropSchema(d);
      const { code } = await p.exited;
      expect(code).to.equal(1);
      const errors = p.output().split('\n').filter((l) => l.includes('"level":"error"'));
      expect(errors, errors.join('\n')).to.have.length(1);
      expect(errors[0]).to.include('schema is missing');
    } finally {
      await p.kill('SIGKILL');
    }
  });
});

/**
 * Drops Sarsen's schema under the running process. The drop locks every table in turn while the
 * process's statements lock some of them in another order, so PostgreSQL may end the drop as a
 * deadlock's victim: an operator would run it again, and so does this.
 */
async function dropSchema(d: Deployment): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await d.pool.query('DROP SCHEMA sarsen CASCADE');
      return;
    } catch (err) {
      if ((err as { code?: string }).code !== '40P01' || attempt === 10) throw err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}
