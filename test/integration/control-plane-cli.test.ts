// `sarsen tenancy create` and the embedded first run, as real child processes; and the log
// guard that proves no registered secret reaches a log line.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { makeSecretsDir, sarsenEnv, spawnSarsen, spawnProcess, type SecretsDir, type SarsenChild } from '../support/child.ts';
import { startTestServer } from '../support/server.ts';
import { registerSecret, allowPrintedLine, findLeaks, logGuardStats, capturedLines } from '../support/log-guard.ts';
import { call } from '../support/control-plane.ts';
import { logger } from '../../src/log.ts';

async function run(args: string[], env: NodeJS.ProcessEnv): Promise<{ code: number | null; output: string }> {
  const child = spawnSarsen(args, env);
  const { code } = await child.exited;
  return { code, output: child.output() };
}

const count = (haystack: string, needle: string) => haystack.split(needle).length - 1;

describe('sarsen tenancy create', () => {
  let db: TestDatabase;
  let secrets: SecretsDir;
  let env: NodeJS.ProcessEnv;

  before(async () => {
    db = await createTestDatabase();
    secrets = makeSecretsDir(db.conn);
    env = sarsenEnv(db.conn, secrets.dir);
  });
  after(async () => {
    secrets?.remove();
    await db?.drop();
  });

  it('creates the tenancy and its owner and prints the generated password once, on its own line', async () => {
    const { code, output } = await run(['tenancy', 'create', 'acme', '--owner', 'Owner@Acme.TEST'], env);
    expect(code, output).to.equal(0);
    const lines = output.split('\n');
    const passwordLines = lines.filter((l) => l.startsWith('password: '));
    expect(passwordLines).to.have.length(1);
    const password = passwordLines[0]!.slice('password: '.length);
    expect(password).to.match(/^[2-9a-zA-Z]{24}$/);
    registerSecret(password);
    // Printed once, on that line and no other; the log guard lets that one line through.
    expect(count(output, password)).to.equal(1);
    allowPrintedLine(passwordLines[0]!);

    const { rows } = await (async () => {
      const server = await startTestServer({ db });
      try {
        const res = await call(server.url, 'POST', '/acme/v1/sessions', { body: { email: 'owner@acme.test', password } });
        expect(res.status, res.text).to.equal(201);
        registerSecret(res.body.token);
        expect(res.body.password_change_required).to.equal(true);
        expect(res.body.role).to.equal('owner');
        const blocked = await call(server.url, 'GET', '/acme/v1/tenancy', { token: res.body.token });
        expect(blocked.body.error.code).to.equal('password_change_required');
        return server.pool.query('SELECT password_hash FROM sarsen.users');
      } finally {
        await server.close();
      }
    })();
    expect(rows).to.have.length(1);
    expect(rows[0].password_hash).not.to.include(password);
  });

  it('refuses an existing slug, a bad slug, a bad email and a missing --owner, printing no password', async () => {
    const cases: [string[], RegExp][] = [
      [['tenancy', 'create', 'acme', '--owner', 'second@acme.test'], /already exists/],
      [['tenancy', 'create', 'Bad_Slug', '--owner', 'x@y.test'], /not a tenancy slug/],
      [['tenancy', 'create', 'v1', '--owner', 'x@y.test'], /not a tenancy slug/],
      [['tenancy', 'create', 'fine', '--owner', 'not-an-email'], /not an email address/],
      [['tenancy', 'create', 'fine'], /usage: sarsen tenancy create/],
      [['tenancy', 'delete', 'acme', '--owner', 'x@y.test'], /usage: sarsen tenancy create/],
    ];
    for (const [args, message] of cases) {
      const { code, output } = await run(args, env);
      expect(code, args.join(' ')).to.equal(1);
      expect(output, args.join(' ')).to.match(message);
      expect(output).not.to.match(/^password: /m);
    }
  });
});

describe('embedded first run', () => {
  let dataDir: string;
  let child: SarsenChild | null = null;

  before(() => {
    dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-first-run-'));
  });
  afterEach(async () => {
    if (child) {
      await child.kill('SIGTERM');
      child = null;
    }
  });
  after(() => {
    fs.rmSync(dataDir, { recursive: true, force: true });
  });

  function embeddedEnv(): NodeJS.ProcessEnv {
    const env: NodeJS.ProcessEnv = { ...process.env };
    for (const key of Object.keys(env)) if (key.startsWith('CTX_')) delete env[key];
    return { ...env, CTX_DATA_DIR: dataDir };
  }

  async function start(): Promise<{ url: string; output: () => string }> {
    child = spawnSarsen(['serve', '--port', '0'], embeddedEnv());
    const m = await child.waitFor(/"message":"sarsen listening"[^\n]*"url":"(http:\/\/[^"]+)"|"url":"(http:\/\/[^"]+)"[^\n]*"message":"sarsen listening"/, 120_000);
    const c = child;
    return { url: (m[1] ?? m[2])!, output: () => c.output() };
  }

  it('creates default/default and admin@localhost, prints the password once, and allows local backends', async () => {
    const { url, output } = await start();
    // The banner follows the listening line.
    const shown = await child!.waitFor(/^password: (\S+)$/m);
    const password = shown[1]!;
    registerSecret(password);
    expect(count(output(), password)).to.equal(1);
    allowPrintedLine(shown[0]);
    expect(output()).to.include('admin@localhost');

    const signIn = await call(url, 'POST', '/default/v1/sessions', { body: { email: 'admin@localhost', password } });
    expect(signIn.status, signIn.text).to.equal(201);
    const token = signIn.body.token as string;
    registerSecret(token);
    const chosen = 'a password chosen by the operator';
    registerSecret(chosen);
    const changed = await call(url, 'POST', '/default/v1/account/password', { token, body: { current_password: password, new_password: chosen } });
    expect(changed.status).to.equal(204);
    const ns = await call(url, 'GET', '/default/v1/namespaces/default', { token });
    expect(ns.status).to.equal(200);
    const local = await call(url, 'POST', '/default/v1/namespaces/default/backends', {
      token,
      body: { name: 'local', kind: 'chat_compat', address: 'http://127.0.0.1:11434/v1' },
    });
    expect(local.status, local.text).to.equal(201);
  });

  it('does nothing of the sort on the second run', async () => {
    const { url, output } = await start();
    const res = await call(url, 'GET', '/default/v1/namespaces');
    expect(res.status).to.equal(401);
    // Whatever it printed is in by the time it has answered a request and exited.
    const { code } = await child!.kill('SIGTERM');
    expect(code).to.equal(0);
    expect(output()).not.to.match(/^password: /m);
    expect(output()).not.to.include('first run');
  });
});

describe('log guard', () => {
  it('captures every log line of this process', () => {
    const before = logGuardStats().lines;
    logger.info('log guard probe', { probe: 1 });
    expect(logGuardStats().lines).to.equal(before + 1);
  });

  it('captures every line a child process prints: its log lines, its plain prints and its crash trace', async () => {
    const marker = `child-log-probe-${process.pid}-${Date.now()}`;
    const script = `console.log(JSON.stringify({ message: '${marker} logged' })); console.error('sarsen: ${marker} printed'); throw new Error('${marker} thrown');`;
    const child = spawnProcess(process.execPath, ['-e', script]);
    const closed = new Promise((r) => child.child.once('close', r)); // its output read to the end
    expect((await child.exited).code).to.equal(1);
    await closed;
    const found = findLeaks(capturedLines(), [marker]).map((l) => l.line);
    expect(found).to.include.members([`{"message":"${marker} logged"}`, `sarsen: ${marker} printed`, `Error: ${marker} thrown`]);
  });

  it('finds a registered secret in a captured line, and only there', () => {
    const secret = 'sk-leaky-0123456789';
    expect(findLeaks(['{"message":"calling with sk-leaky-0123456789"}', '{"message":"clean"}'], [secret])).to.have.length(1);
    expect(findLeaks(['sarsen: calling with sk-leaky-0123456789'], [secret])).to.have.length(1);
    expect(findLeaks(['{"message":"clean"}'], [secret])).to.have.length(0);
  });

  it('lets through the exact line a test allowed, and the same secret on any other line still counts', () => {
    const secret = 'sk-leaky-0123456789';
    const shown = `password: ${secret}`;
    const captured = [shown, `{"message":"signed in with ${secret}"}`, `${shown} `];
    expect(findLeaks(captured, [secret], new Set([shown])).map((l) => l.line)).to.deep.equal(captured.slice(1));
  });

  it('refuses to register something that is not a secret', () => {
    expect(() => registerSecret('')).to.throw();
    expect(() => registerSecret(undefined)).to.throw();
  });
});
