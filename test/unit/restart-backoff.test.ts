import os from 'node:os';
import { expect } from 'chai';
import { restartAfter, RESTART_POLICY } from '../../src/core/restart-backoff.ts';
import { serveOptions, readEnvironment, ConfigError } from '../../src/config/config.ts';
import { processCount } from '../../src/cli/cluster.ts';
import { parseHosts } from '../../src/core/hosts.ts';

describe('replacing dead workers', () => {
  it('doubles the wait while replacements die young, up to the cap', () => {
    let failures = 0;
    const delays = [];
    for (let i = 0; i < 12; i++) {
      const next = restartAfter(failures, 1_000);
      delays.push(next.delayMs);
      failures = next.failures;
    }
    expect(delays.slice(0, 4)).to.deep.equal([100, 200, 400, 800]);
    expect(Math.max(...delays)).to.equal(RESTART_POLICY.maxMs);
    expect(delays).to.deep.equal([...delays].sort((a, b) => a - b));
  });

  it('starts over after a worker that lived long enough', () => {
    expect(restartAfter(9, RESTART_POLICY.stableMs)).to.deep.equal({ delayMs: RESTART_POLICY.firstMs, failures: 1 });
    expect(restartAfter(1e6, 0).delayMs).to.equal(RESTART_POLICY.maxMs);
  });
});

describe('--processes', () => {
  it('is taken from the flag, else CTX_PROCESSES, else one where PostgreSQL shares the machine and one per core where it runs elsewhere', () => {
    expect(serveOptions({ processes: '3' }, false).processes).to.equal(3);
    expect(serveOptions({}, false).processes).to.equal(null);
    expect(readEnvironment({ CTX_PROCESSES: '4' }).processes).to.equal(4);
    expect(readEnvironment({}).processes).to.equal(null);
    const hosts = (list: string) => parseHosts(list, 5432);
    expect(processCount(null, null)).to.equal(1); // embedded
    for (const local of ['127.0.0.1', 'localhost', '[::1]:5433', '/var/run/postgresql', '127.0.0.1:5432,localhost:5433']) {
      expect(processCount(null, hosts(local)), local).to.equal(1);
    }
    for (const remote of ['10.0.0.5', 'db.example', '127.0.0.1,10.0.0.6:5433', '[2001:db8::1]']) {
      expect(processCount(null, hosts(remote)), remote).to.equal(os.availableParallelism());
    }
    expect(processCount(2, null)).to.equal(2);
    expect(processCount(3, hosts('10.0.0.5'))).to.equal(3);
  });

  it('refuses what is not a positive whole number', () => {
    for (const bad of ['0', '-1', '1.5', 'many']) expect(() => serveOptions({ processes: bad }, false), bad).to.throw(ConfigError, /processes/);
    expect(() => readEnvironment({ CTX_PROCESSES: '0' })).to.throw(ConfigError, /CTX_PROCESSES/);
  });
});
