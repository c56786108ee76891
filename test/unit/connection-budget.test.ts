import { expect } from 'chai';
import { connectionBudget, defaultConnections, minimumConnections, PURPOSES } from '../../src/core/connection-budget.ts';
import { parseHosts, formatHost } from '../../src/core/hosts.ts';
import { serveOptions, readEnvironment, ConfigError } from '../../src/config/config.ts';

const sum = (b: ReturnType<typeof connectionBudget>) => PURPOSES.reduce((n, p) => n + b[p], 0);

describe('connection budget', () => {
  it('splits each role\'s default as docs/scaling.md says', () => {
    expect(connectionBudget('api')).to.deep.equal({ total: 11, bus: 1, queue: 0, writers: 2, main: 8 });
    expect(connectionBudget('executor')).to.deep.equal({ total: 12, bus: 1, queue: 3, writers: 4, main: 4 });
    expect(connectionBudget('both')).to.deep.equal({ total: 18, bus: 1, queue: 3, writers: 6, main: 8 });
  });

  it('never gives out more or fewer connections than the total, at any total a role runs with', () => {
    for (const role of ['api', 'executor', 'both'] as const) {
      for (let total = minimumConnections(role); total <= 60; total++) {
        const b = connectionBudget(role, total);
        expect(sum(b), `${role} ${total}`).to.equal(total);
        expect(b.bus).to.equal(1);
        expect(b.main).to.be.at.least(2);
        expect(b.writers).to.be.at.least(1);
        if (role === 'api') expect(b.queue).to.equal(0);
        else expect(b.queue).to.be.within(2, 3);
      }
      expect(() => connectionBudget(role, minimumConnections(role) - 1)).to.throw(RangeError);
    }
  });

  it('shrinks the main pool first, then graphile-worker\'s third connection, then the writers', () => {
    expect(connectionBudget('both', defaultConnections('both') - 6)).to.include({ main: 2, queue: 3, writers: 6 });
    expect(connectionBudget('both', defaultConnections('both') - 7)).to.include({ main: 2, queue: 2, writers: 6 });
    expect(connectionBudget('both', minimumConnections('both'))).to.include({ main: 2, queue: 2, writers: 1 });
    expect(connectionBudget('api', 30)).to.include({ main: 27, writers: 2 });
  });

  it('is a flag of sarsen serve, refused below the role\'s minimum', () => {
    expect(serveOptions({ role: 'executor', 'database-connections': '20' }, false).serve.databaseConnections).to.equal(20);
    expect(serveOptions({}, false).serve.databaseConnections).to.equal(undefined);
    expect(() => serveOptions({ role: 'both', 'database-connections': '5' }, false)).to.throw(ConfigError, /at least 6/);
    expect(() => serveOptions({ 'database-connections': 'many' }, false)).to.throw(ConfigError);
  });
});

describe('database hosts', () => {
  it('reads libpq\'s multi-host form, each host with its own port or the default', () => {
    expect(parseHosts('db1:5433,db2', 5432)).to.deep.equal([{ host: 'db1', port: 5433 }, { host: 'db2', port: 5432 }]);
    expect(parseHosts(' 127.0.0.1:6001 , 127.0.0.1:6002 ', 5432)).to.deep.equal([{ host: '127.0.0.1', port: 6001 }, { host: '127.0.0.1', port: 6002 }]);
    expect(parseHosts('[::1]:6001,::1,[fe80::1]', 5432)).to.deep.equal([{ host: '::1', port: 6001 }, { host: '::1', port: 5432 }, { host: 'fe80::1', port: 5432 }]);
    expect(parseHosts('/var/run/postgresql', 5433)).to.deep.equal([{ host: '/var/run/postgresql', port: 5433 }]);
    expect(formatHost({ host: '::1', port: 5432 })).to.equal('[::1]:5432');
  });

  it('refuses an empty host or a bad port, at startup', () => {
    for (const bad of ['db1,,db2', 'db1:', 'db1:0', 'db1:70000', 'db1:x', '[::1']) expect(() => parseHosts(bad, 5432), bad).to.throw();
    expect(() => readEnvironment({ CTX_DATABASE_HOST: 'db1:5432,' })).to.throw(ConfigError, /CTX_DATABASE_HOST/);
    expect(readEnvironment({ CTX_DATABASE_HOST: 'db1:5432,db2:5432' }).database?.host).to.equal('db1:5432,db2:5432');
  });
});
