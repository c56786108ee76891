// SARSEN_TRACE (src/trace.ts): a real process writes each submission's milestones, in the order
// they happen, for bench:compare --trace to follow the slowest requests end to end.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { startDeployment, type Deployment } from '../support/processes.ts';
import { provision } from '../support/tenant.ts';
import { rawRequest, json } from '../support/http.ts';

describe('SARSEN_TRACE', function () {
  this.timeout(120_000);
  let provider: FakeProvider;
  let d: Deployment;
  let dir: string;

  before(async () => {
    provider = await startFakeProvider();
    d = await startDeployment();
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-trace-test-'));
  });
  after(async () => {
    await d?.close();
    await provider?.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('writes a synchronous request\'s milestones in order, from arrival to the answer written', async () => {
    const prefix = path.join(dir, 'trace');
    const sarsen = await d.start('both', { SARSEN_TRACE: prefix });
    const t = await provision(d.asServer(sarsen), provider);
    const res = await rawRequest(`${t.base}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content: 'trace me' }] }),
    });
    expect(res.status).to.equal(200);
    const { code } = await sarsen.kill('SIGTERM');
    expect(code, sarsen.output()).to.equal(0);

    const lines = fs.readFileSync(`${prefix}.${sarsen.child.pid}`, 'utf8').trim().split('\n');
    // Provisioning went through the administration routes: the one submission is all there is.
    const mine = lines.map((l) => l.split(' ')).filter(([rid]) => rid !== '-');
    expect(new Set(mine.map(([rid]) => rid)).size, lines.join('\n')).to.equal(1);
    // Written as they happen, but the arrival is written with the answer, at its own time.
    const stages = mine.map(([, stage, at]) => ({ stage, at: Number(at) }));
    const arrived = stages.find((s) => s.stage === 'arrived')!;
    const rest = stages.filter((s) => s !== arrived);
    expect(rest.map((s) => s.stage)).to.deep.equal([
      'submit', 'accept_flush', 'accept_commit', 'provider_call', 'provider_answered', 'provider_done', 'terminal_flush', 'terminal_commit', 'answered',
    ]);
    for (const [i, s] of rest.entries()) expect(s.at, s.stage).to.be.at.least(i === 0 ? arrived.at : rest[i - 1]!.at);
    expect(json(res).choices).to.be.an('array');
    // Batched stages name their batch's size.
    expect(mine.find(([, stage]) => stage === 'accept_flush')![3]).to.equal('1');
  });
});
