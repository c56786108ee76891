// The `sarsen` command as operators run it: real child processes against real databases.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createEmptyDatabase, createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';
import { makeSecretsDir, sarsenEnv, spawnSarsen, type SecretsDir } from '../support/child.ts';
import { allowPrintedLine, registerSecret } from '../support/log-guard.ts';
import { SETTING_SCHEMAS } from '../../src/config/settings.ts';

describe('sarsen command', function () {
  this.timeout(120_000);

  describe('migrate', () => {
    let db: TestDatabase;
    let secrets: SecretsDir;
    beforeEach(async () => {
      db = await createEmptyDatabase();
      secrets = makeSecretsDir(db.conn);
    });
    afterEach(async () => {
      secrets.remove();
      await db.drop();
    });

    it('applies every migration once when two processes race on an empty database', async () => {
      const env = sarsenEnv(db.conn, secrets.dir);
      const a = spawnSarsen(['migrate'], env);
      const b = spawnSarsen(['migrate'], env);
      const [ea, eb] = await Promise.all([a.exited, b.exited]);
      expect(ea.code, a.output()).to.equal(0);
      expect(eb.code, b.output()).to.equal(0);
      const pool = testPool(db.conn);
      try {
        const files = fs.readdirSync('sql/migrations').filter((f) => f.endsWith('.sql')).map((f) => f.replace(/\.sql$/, ''));
        const { rows } = await pool.query<{ name: string }>('SELECT name FROM sarsen.migrations ORDER BY id');
        expect(rows.map((r) => r.name)).to.deep.equal(files.sort());
        const worker = await pool.query(`SELECT count(*)::int AS n FROM graphile_worker.migrations`);
        expect(worker.rows[0].n).to.be.greaterThan(0);
        // Every setting the code validates is seeded by a migration, and nothing else.
        const settings = await pool.query<{ name: string }>(`SELECT name FROM sarsen.settings ORDER BY name`);
        expect(settings.rows.map((r) => r.name)).to.deep.equal(Object.keys(SETTING_SCHEMAS).sort());
      } finally {
        await pool.end();
      }
    });
  });

  describe('secrets', () => {
    let db: TestDatabase;
    before(async () => {
      db = await createTestDatabase();
    });
    after(async () => {
      await db.drop();
    });

    for (const name of ['credential-key', 'api-key-hash-key', 'database-password']) {
      it(`stops with a message naming ${name} when it is missing`, async () => {
        const secrets = makeSecretsDir(db.conn, [name]);
        try {
          const child = spawnSarsen(['migrate'], sarsenEnv(db.conn, secrets.dir));
          const { code } = await child.exited;
          expect(code).to.equal(1);
          expect(child.output()).to.include(path.join(secrets.dir, name));
          expect(child.output()).to.match(/missing/);
        } finally {
          secrets.remove();
        }
      });
    }

    it('stops when a key file is too short', async () => {
      const secrets = makeSecretsDir(db.conn);
      try {
        fs.writeFileSync(path.join(secrets.dir, 'credential-key'), 'short\n');
        const child = spawnSarsen(['serve', '--port', '0'], sarsenEnv(db.conn, secrets.dir));
        const { code } = await child.exited;
        expect(code).to.equal(1);
        expect(child.output()).to.include(`${path.join(secrets.dir, 'credential-key')} is too short`);
        expect(child.output()).to.not.include('sarsen listening');
      } finally {
        secrets.remove();
      }
    });
  });

  describe('settings', () => {
    let db: TestDatabase;
    let secrets: SecretsDir;
    before(async () => {
      db = await createTestDatabase();
      secrets = makeSecretsDir(db.conn);
    });
    after(async () => {
      secrets.remove();
      await db.drop();
    });
    const run = async (...args: string[]) => {
      const child = spawnSarsen(['settings', ...args], sarsenEnv(db.conn, secrets.dir));
      const { code } = await child.exited;
      return { code, out: child.output() };
    };

    it('gets every setting and one by name', async () => {
      const all = await run('get');
      expect(all.code).to.equal(0);
      expect(all.out).to.match(/^synchronous_hold_ms 300000$/m);
      expect(all.out).to.match(/^idempotency_window_ms 600000$/m);
      const one = await run('get', 'max_attempts');
      expect(one.out.trim()).to.equal('3');
    });

    it('sets a valid value and refuses invalid ones without storing them', async () => {
      expect((await run('set', 'max_attempts', '5')).code).to.equal(0);
      expect((await run('get', 'max_attempts')).out.trim()).to.equal('5');
      for (const [name, value, pattern] of [
        ['max_attempts', '0', /max_attempts/],
        ['max_attempts', '2.5', /max_attempts/],
        ['metering_enabled', 'yes', /metering_enabled/],
        ['lease_ms', '100', /heartbeat_ms must be at most half of lease_ms/],
        ['no_such_setting', '1', /Unknown setting/],
      ] as const) {
        const res = await run('set', name, value);
        expect(res.code, `${name}=${value}`).to.equal(1);
        expect(res.out).to.match(pattern);
      }
      expect((await run('get', 'max_attempts')).out.trim()).to.equal('5');
      expect((await run('get', 'lease_ms')).out.trim()).to.equal('30000');
    });
  });

  describe('credit and prices', () => {
    it('grants credit to a tenancy and sets a price; refuses bad amounts and unknown tenancies', async () => {
      const db = await createTestDatabase();
      const secrets = makeSecretsDir(db.conn);
      const run = async (...args: string[]) => {
        const child = spawnSarsen(args, sarsenEnv(db.conn, secrets.dir));
        const { code } = await child.exited;
        return { code, out: child.output() };
      };
      try {
        const created = await run('tenancy', 'create', 'billed', '--owner', 'owner@billed.test');
        expect(created.code, created.out).to.equal(0);
        const shown = /^password: (\S+)$/m.exec(created.out);
        if (shown) {
          registerSecret(shown[1]);
          allowPrintedLine(shown[0]);
        }
        expect(await run('credit', 'grant', 'billed', '5000000')).to.deep.include({ code: 0 });
        const again = await run('credit', 'grant', 'billed', '1000000');
        expect(again.out).to.match(/^balance: 6000000$/m);
        expect((await run('credit', 'grant', 'billed', 'x')).code).to.equal(1);
        expect((await run('credit', 'grant', 'nobody', '5')).code).to.equal(1);
        expect((await run('credit', 'grant', 'billed', '1.5')).code).to.equal(1);
        expect((await run('prices', 'set', 'gpt-x', '150000', '600000')).code).to.equal(0);
        expect((await run('prices', 'set', 'gpt-x', 'cheap', '1')).code).to.equal(1);
        const pool = testPool(db.conn);
        try {
          const price = await pool.query(`SELECT prompt_micros_per_mtok, completion_micros_per_mtok FROM sarsen.prices WHERE model = 'gpt-x'`);
          expect(price.rows[0]).to.deep.equal({ prompt_micros_per_mtok: 150000, completion_micros_per_mtok: 600000 });
        } finally {
          await pool.end();
        }
      } finally {
        secrets.remove();
        await db.drop();
      }
    });
  });

  describe('serve', () => {
    it('serves on embedded PostgreSQL with no CTX_DATABASE_HOST, stops cleanly on SIGINT, and reuses its data', async () => {
      const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-embedded-'));
      try {
        const env: NodeJS.ProcessEnv = { ...process.env, CTX_DATA_DIR: dataDir };
        for (const key of Object.keys(env)) if (key.startsWith('CTX_DATABASE_') || key === 'CTX_SECRETS_DIR') delete env[key];
        const secretFile = path.join(dataDir, 'secrets', 'credential-key');
        let firstSecret = '';
        for (const round of [1, 2]) {
          const child = spawnSarsen(['--port', '0'], env);
          const [, url] = (await child.waitFor(/"message":"sarsen listening".*?"url":"(http:[^"]+)"|"url":"(http:[^"]+)".*?"message":"sarsen listening"/, 90_000)).filter(Boolean);
          const ready = await fetch(`${url}/readyz`);
          expect(ready.status).to.equal(200);
          const mode = fs.statSync(secretFile).mode & 0o777;
          expect(mode).to.equal(0o600);
          if (round === 1) firstSecret = fs.readFileSync(secretFile, 'utf8');
          else expect(fs.readFileSync(secretFile, 'utf8')).to.equal(firstSecret);
          const { code } = await child.kill('SIGINT');
          expect(code, child.output()).to.equal(0);
          expect(child.output()).to.include('sarsen stopped');
          // PostgreSQL was stopped too: no postmaster.pid is left behind.
          expect(fs.existsSync(path.join(dataDir, 'pg', 'postmaster.pid'))).to.equal(false);
        }
      } finally {
        fs.rmSync(dataDir, { recursive: true, force: true });
      }
    });

    it('exits 0 on SIGTERM against a server database', async () => {
      const db = await createTestDatabase();
      const secrets = makeSecretsDir(db.conn);
      try {
        const child = spawnSarsen(['--port', '0', '--role', 'api'], sarsenEnv(db.conn, secrets.dir));
        const m = await child.waitFor(/"url":"(http:[^"]+)"/);
        expect((await fetch(`${m[1]}/healthz`)).status).to.equal(200);
        const { code } = await child.kill('SIGTERM');
        expect(code, child.output()).to.equal(0);
      } finally {
        secrets.remove();
        await db.drop();
      }
    });
  });
});
