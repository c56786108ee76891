// No Docker engine runs on our machines, so the image is reproduced from the Dockerfile itself:
// each stage in a folder of its own (its WORKDIR), filled by that stage's COPY lines (from the
// build context as .dockerignore leaves it, or from an earlier stage), running the npm commands
// of its RUN lines; then the final stage's ENTRYPOINT and CMD, with its ENV, are started
// against PostgreSQL until /readyz answers. RUN lines that set up the operating system (a
// symlink into /usr/local/bin) are left out: they would change this machine.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { spawnProcess } from '../support/child.ts';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { makeSecretsDir, type SecretsDir } from '../support/child.ts';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

type Step = { kind: 'copy'; from: string | null; sources: string[]; dest: string } | { kind: 'run'; command: string };
type Stage = { name: string; workdir: string; steps: Step[]; env: Record<string, string>; entrypoint: string[]; cmd: string[] };

/** The Dockerfile's stages (continuation lines joined, comments dropped). */
function parseDockerfile(text: string): Stage[] {
  const lines = text.replace(/\\\n/g, ' ').split('\n').map((l) => l.trim()).filter((l) => l !== '' && !l.startsWith('#'));
  const stages: Stage[] = [];
  for (const line of lines) {
    const [instruction, ...rest] = line.split(/\s+/);
    const args = rest.join(' ');
    const stage = stages[stages.length - 1];
    switch (instruction!.toUpperCase()) {
      case 'FROM': {
        const m = /\bAS\s+(\S+)$/i.exec(args);
        stages.push({ name: m ? m[1]! : `stage${stages.length}`, workdir: '/', steps: [], env: {}, entrypoint: [], cmd: [] });
        break;
      }
      case 'WORKDIR':
        stage!.workdir = args;
        break;
      case 'COPY': {
        const words = args.split(/\s+/);
        const from = words[0]!.startsWith('--from=') ? words.shift()!.slice('--from='.length) : null;
        const dest = words.pop()!;
        stage!.steps.push({ kind: 'copy', from, sources: words, dest });
        break;
      }
      case 'RUN':
        stage!.steps.push({ kind: 'run', command: args });
        break;
      case 'ENV':
        for (const m of args.matchAll(/(\w+)=(?:"([^"]*)"|(\S+))/g)) stage!.env[m[1]!] = m[2] ?? m[3]!;
        break;
      case 'ENTRYPOINT':
        stage!.entrypoint = JSON.parse(args);
        break;
      case 'CMD':
        stage!.cmd = JSON.parse(args);
        break;
    }
  }
  return stages;
}

/** What the build context holds for `source`, as .dockerignore leaves it. */
function contextPath(source: string, ignored: string[]): string {
  const rel = path.normalize(source);
  if (ignored.some((i) => rel === i || rel.startsWith(`${i}/`))) throw new Error(`COPY ${source}: .dockerignore excludes it`);
  return path.join(ROOT, rel);
}

describe('the Dockerfile, stage by stage', function () {
  this.timeout(300_000);
  let work: string;
  let db: TestDatabase;
  let secrets: SecretsDir;
  before(async () => {
    work = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-image-'));
    db = await createTestDatabase();
    secrets = makeSecretsDir(db.conn);
  });
  after(async () => {
    fs.rmSync(work, { recursive: true, force: true });
    secrets?.remove();
    await db?.drop();
  });

  it('builds from its own COPY lines and the compiled sarsen answers /readyz', async () => {
    const stages = parseDockerfile(fs.readFileSync(path.join(ROOT, 'Dockerfile'), 'utf8'));
    expect(stages.map((s) => s.name)).to.deep.equal(['build', 'deps', 'stage2']);
    const ignored = fs.readFileSync(path.join(ROOT, '.dockerignore'), 'utf8').split('\n').map((l) => l.trim()).filter((l) => l && !l.startsWith('#'));
    const dirs = new Map<string, string>();
    // The npm cache this machine already has (npm ci ran before the tests): no network unless it lacks something.
    const npmEnv = { ...process.env, npm_config_prefer_offline: 'true', npm_config_update_notifier: 'false' };

    for (const stage of stages) {
      const dir = path.join(work, stage.name);
      fs.mkdirSync(dir, { recursive: true });
      dirs.set(stage.name, dir);
      const inStage = (p: string, s: Stage) => path.join(dirs.get(s.name)!, path.relative(s.workdir, path.resolve(s.workdir, p)));
      for (const step of stage.steps) {
        if (step.kind === 'copy') {
          const fromStage = step.from === null ? null : stages.find((s) => s.name === step.from)!;
          const dest = inStage(step.dest, stage);
          for (const source of step.sources) {
            const from = fromStage ? inStage(source, fromStage) : contextPath(source, ignored);
            expect(fs.existsSync(from), `COPY ${source} in stage ${stage.name}`).to.equal(true);
            const target = step.dest.endsWith('/') || step.sources.length > 1 ? path.join(dest, path.basename(from)) : dest;
            fs.cpSync(from, target, { recursive: true, verbatimSymlinks: true });
          }
        } else if (/^(npm|npx) /.test(step.command)) {
          const run = spawnProcess('sh', ['-c', step.command], { cwd: dir, env: npmEnv, label: step.command });
          const exit = await run.exited;
          expect(exit.code, `RUN ${step.command} in stage ${stage.name}:\n${run.output()}`).to.equal(0);
        }
      }
    }

    const final = stages[stages.length - 1]!;
    const app = dirs.get(final.name)!;
    expect(fs.existsSync(path.join(app, 'node_modules', 'typescript')), 'dev dependencies in the image').to.equal(false);
    expect(fs.existsSync(path.join(app, 'src')), 'sources in the image').to.equal(false);
    expect(final.entrypoint).to.deep.equal(['sarsen']);
    const env: NodeJS.ProcessEnv = { PATH: process.env.PATH, HOME: process.env.HOME, ...final.env };
    Object.assign(env, {
      CTX_DATABASE_HOST: db.conn.host,
      CTX_DATABASE_PORT: String(db.conn.port),
      CTX_DATABASE_USER: db.conn.user,
      CTX_DATABASE_NAME: db.conn.database,
      CTX_SECRETS_DIR: secrets.dir,
    });
    // ENTRYPOINT ["sarsen"] is the image's link to bin/sarsen.js.
    const sarsen = spawnProcess(process.execPath, [path.join(app, 'bin', 'sarsen.js'), ...final.cmd, '--port', '0', '--host', '127.0.0.1'], { cwd: app, env, label: 'image sarsen' });
    try {
      const [, url] = await sarsen.waitFor(/"url":"(http:[^"]+)"/, 60_000);
      const ready = await fetch(`${url}/readyz`);
      expect(ready.status).to.equal(200);
      expect((await fetch(`${url}/metrics`)).status).to.equal(200);
    } finally {
      const exit = await sarsen.kill('SIGTERM');
      expect(exit.code, sarsen.output()).to.equal(0);
    }
    expect(sarsen.output(), 'the compiled build ran, not the sources').to.not.include('.ts:');
  });
});

describe('compose.yaml', () => {
  it('runs PostgreSQL, an api and an executor process of the image, secrets as files, restarting what exits', async () => {
    const { parse } = await import('yaml');
    const { SECRET_FILES } = await import('../../src/config/secrets.ts');
    const compose = parse(fs.readFileSync(path.join(ROOT, 'compose.yaml'), 'utf8'), { merge: true });
    expect(Object.keys(compose.services)).to.have.members(['postgres', 'api', 'executor']);
    for (const [name, role] of [['api', 'api'], ['executor', 'executor']] as const) {
      const service = compose.services[name];
      expect(service.build).to.equal('.');
      expect(service.command.slice(0, 3)).to.deep.equal(['serve', '--role', role]);
      expect(service.environment.CTX_DATABASE_HOST).to.equal('postgres');
      expect(service.secrets).to.have.members([...SECRET_FILES]);
      expect(service.environment.CTX_SECRETS_DIR).to.equal('/run/secrets'); // where compose mounts them
    }
    for (const service of Object.values(compose.services) as { restart: string }[]) expect(service.restart).to.equal('unless-stopped');
    expect(Object.keys(compose.secrets)).to.have.members([...SECRET_FILES]);
    expect(compose.services.postgres.environment.POSTGRES_PASSWORD_FILE).to.equal('/run/secrets/database-password');
  });
});
