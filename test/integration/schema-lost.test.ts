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
    await d.pool.query('DROP SCHEMA sarsen CASCADE');
    const { code } = await p.exited;
    expect(code).to.equal(1);
    const errors = p.output().split('\n').filter((l) => l.includes('"level":"error"'));
    expect(errors, errors.join('\n')).to.have.length(1);
    expect(errors[0]).to.include('schema is missing');
  });
});
