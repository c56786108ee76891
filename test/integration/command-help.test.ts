// Every `sarsen` command and sub-command answers --help and -h with its usage on stdout and
// exit 0 (issue 41). The commands come from the code's own table, so a command added without
// help fails here; each runs as operators run it, bin/sarsen.js in a child process, with a
// database that does not answer: help never reaches for one.
import { expect } from 'chai';
import { once } from 'node:events';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { COMMANDS, groups, parseInvocation, usage } from '../../src/cli/commands.ts';
import { spawnNode } from '../support/child.ts';

const BIN = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../bin/sarsen.js');

/** The environment of a deployment whose database is unreachable and whose secrets are absent. */
function offlineEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const key of Object.keys(env)) if (key.startsWith('CTX_')) delete env[key];
  return { ...env, CTX_DATABASE_HOST: '127.0.0.1', CTX_DATABASE_PORT: '1', CTX_SECRETS_DIR: '/nonexistent/sarsen-secrets' };
}

async function run(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawnNode(BIN, args, offlineEnv(), 'sarsen');
  // 'exit' can come before the child's output has been read (a busy machine); 'close' comes after its pipes are drained.
  const closed = once(child.child, 'close');
  let stdout = '';
  let stderr = '';
  child.child.stdout!.on('data', (b: Buffer) => (stdout += b.toString('utf8')));
  child.child.stderr!.on('data', (b: Buffer) => (stderr += b.toString('utf8')));
  const { code } = await child.exited;
  await closed;
  return { code, stdout, stderr };
}

const allFlags = [...new Set(COMMANDS.flatMap((c) => Object.keys(c.flags)))];
const helps = ['--help', '-h'];
const groupWords = [...groups().keys()];
const CASES = [
  ...COMMANDS.flatMap((c) => helps.map((h) => [...c.name.split(' '), h])),
  ...groupWords.flatMap((w) => helps.map((h) => [w, h])),
  ['--help'], ['-h'], ['help'],
  ['export', '--no-such-flag', '--help'], ['export', '--no-such-flag'],
  ['no-such-command'], ['no-such-command', '--help'], ['settings', 'frob'],
];

describe('sarsen --help', function () {
  this.timeout(180_000);
  // Every command line runs once, a few at a time: each is a Node process loading the CLI.
  const results = new Map<string, Awaited<ReturnType<typeof run>>>();
  before(async () => {
    const queue = [...CASES];
    await Promise.all(Array.from({ length: 4 }, async () => {
      for (let args = queue.shift(); args; args = queue.shift()) results.set(args.join(' '), await run(args));
    }));
  });
  const result = (args: string[]) => results.get(args.join(' '))!;

  for (const c of COMMANDS) {
    for (const help of helps) {
      it(`sarsen ${c.name} ${help} prints its usage and exits 0`, () => {
        const { code, stdout, stderr } = result([...c.name.split(' '), help]);
        expect(code, stderr).to.equal(0);
        expect(stderr).to.equal('');
        expect(stdout).to.equal(usage(c) + '\n');
        expect(stdout).to.include(`usage: sarsen ${c.name}`);
        for (const flag of Object.keys(c.flags)) expect(stdout).to.include(`--${flag}`);
      });
    }
  }

  for (const [word, members] of groups()) {
    for (const help of helps) {
      it(`sarsen ${word} ${help} prints the usage of ${members.map((m) => m.name).join(' and ')}`, () => {
        const { code, stdout, stderr } = result([word, help]);
        expect(code, stderr).to.equal(0);
        for (const m of members) expect(stdout).to.include(`usage: sarsen ${m.name}`);
      });
    }
  }

  for (const args of [['--help'], ['-h'], ['help']]) {
    it(`sarsen ${args.join(' ')} lists every command`, () => {
      const { code, stdout, stderr } = result(args);
      expect(code, stderr).to.equal(0);
      for (const c of COMMANDS) expect(stdout).to.include(`sarsen ${[c.name, c.args].filter(Boolean).join(' ')}`);
    });
  }

  it('answers --help beside a flag the command does not take, and refuses that flag without it', () => {
    const helped = result(['export', '--no-such-flag', '--help']);
    expect(helped.code, helped.stderr).to.equal(0);
    expect(helped.stdout).to.include('usage: sarsen export');
    const refused = result(['export', '--no-such-flag']);
    expect(refused.code).to.equal(1);
    expect(refused.stdout).to.equal('');
    expect(refused.stderr).to.include("Unknown option '--no-such-flag'").and.include('usage: sarsen export');
  });

  it('refuses an unknown command with exit 1, --help or not', () => {
    for (const args of [['no-such-command'], ['no-such-command', '--help'], ['settings', 'frob']]) {
      const { code, stderr } = result(args);
      expect(code, args.join(' ')).to.equal(1);
      expect(stderr).to.include('usage:');
    }
  });

  // The usage is true to the flags: each command takes exactly the flags its usage names.
  it('each command takes the flags its usage names and refuses every other command\'s', () => {
    for (const c of COMMANDS) {
      const text = usage(c);
      const placeholders = (c.args.match(/\[[^\]]*\]|\S+/g) ?? []).filter((a) => !a.startsWith('[')).map((a) => a.toLowerCase());
      const required = Object.entries(c.flags).flatMap(([name, f]) => (f.type === 'string' && f.required ? [`--${name}=x`] : []));
      for (const flag of allFlags) {
        const f = COMMANDS.flatMap((o) => Object.entries(o.flags)).find(([name]) => name === flag)![1];
        const argv = [...(c.name === 'serve' ? [] : c.name.split(' ')), ...placeholders, ...required, f.type === 'string' ? `--${flag}=1` : `--${flag}`];
        const named = new RegExp(`^  --${flag}\\b`, 'm').test(text);
        if (named) expect(() => parseInvocation(argv), `${c.name} --${flag}`).not.to.throw();
        else expect(() => parseInvocation(argv), `${c.name} --${flag}`).to.throw(/Unknown option/);
      }
    }
  });
});
