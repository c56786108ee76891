// `sarsen batch run` (issue 18, part 4): a batch file through POST /requests and back, as a
// real child process against a real server, killed with SIGKILL halfway and resumed.
import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatCompletionBody, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { spawnSarsen } from '../support/child.ts';
import { until } from '../support/http.ts';

describe('sarsen batch run', function () {
  this.timeout(180_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let dir: string;
  let keyFile: string;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer();
    t = await provision(server, provider);
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-batch-'));
    keyFile = path.join(dir, 'key');
    fs.writeFileSync(keyFile, `${t.key}\n`);
  });
  after(async () => {
    await server?.close();
    await provider?.close();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });
  beforeEach(() => provider.reset());

  const run = (input: string, out: string, extra: string[] = []) =>
    spawnSarsen(['batch', 'run', input, '--base-url', t.base, '--key-file', keyFile, '--out', out, '--concurrency', '32', ...extra], { ...process.env });
  const writeLines = (name: string, lines: object[]) => {
    const file = path.join(dir, name);
    fs.writeFileSync(file, lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
    return file;
  };
  const chatLine = (id: string, content: string, stream = false) => ({
    custom_id: id, method: 'POST', url: '/v1/chat/completions',
    body: { model: 'gpt-test', messages: [{ role: 'user', content }], ...(stream ? { stream: true } : {}) },
  });
  const callsPerMarker = (prefix: string) => {
    const calls = new Map<string, number>();
    for (const e of provider.journal) {
      const content = e.json?.messages?.[0]?.content as string | undefined;
      if (content?.startsWith(prefix)) calls.set(content, (calls.get(content) ?? 0) + 1);
    }
    return calls;
  };

  it('reports bad lines with their numbers and sends nothing', async () => {
    const file = path.join(dir, 'bad.jsonl');
    const big = 'x'.repeat(2 * 1024 * 1024 + 1);
    fs.writeFileSync(
      file,
      [
        JSON.stringify(chatLine('ok-1', 'fine')),
        '{not json',
        JSON.stringify({ body: { model: 'gpt-test' } }),
        JSON.stringify(chatLine('ok-1', 'again')),
        JSON.stringify(chatLine('big', big)),
        JSON.stringify({ ...chatLine('wrong-url', 'x'), url: '/v1/messages' }),
      ].join('\n') + '\n',
    );
    const out = path.join(dir, 'bad-results.jsonl');
    const child = run(file, out);
    const { code } = await child.exited;
    expect(code, child.output()).to.equal(2);
    const text = child.output();
    expect(text).to.include('line 2: not JSON');
    expect(text).to.include('line 3: no custom_id');
    expect(text).to.include('line 4: duplicate custom_id "ok-1" (first on line 1)');
    expect(text).to.include('line 5: body over 2 MiB');
    expect(text).to.include('line 6: url "/v1/messages"');
    expect(fs.existsSync(out)).to.equal(false);
    expect(provider.journal).to.have.length(0);

    // --skip-invalid goes on with the good line.
    const skipping = run(file, out, ['--skip-invalid']);
    expect((await skipping.exited).code, skipping.output()).to.equal(0);
    const results = fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(results.map((r) => [r.custom_id, r.status])).to.deep.equal([['ok-1', 'succeeded']]);
  });

  it('sends each body as written: the provider receives exactly the bytes of the input body', async () => {
    // Already in Sarsen's canonical form (keys sorted, no whitespace), so nothing on the way may
    // change a byte; re-serialised, 1.0 would become 1, 1e2 100 and the seed lose digits.
    const body = '{"max_tokens":1e2,"messages":[{"content":"exact bytes café","role":"user"}],"model":"gpt-test","seed":12345678901234567890,"temperature":1.0}';
    const file = path.join(dir, 'exact.jsonl');
    fs.writeFileSync(file, `{"custom_id":"exact","body":${body}}\n`);
    const out = path.join(dir, 'exact-results.jsonl');
    const child = run(file, out);
    expect((await child.exited).code, child.output()).to.equal(0);
    expect(JSON.parse(fs.readFileSync(out, 'utf8')).status).to.equal('succeeded');
    expect(provider.journal).to.have.length(1);
    expect(provider.journal[0]!.body.equals(Buffer.from(body))).to.equal(true, provider.journal[0]!.body.toString());
  });

  it('runs a 2,000-line file to completion: results in input order, one provider call per line, streamed lines as their replay', async () => {
    const lines = Array.from({ length: 2000 }, (_, i) => chatLine(`c${i}`, `full ${i}`, i % 100 === 0));
    const file = writeLines('full.jsonl', lines);
    const out = path.join(dir, 'full-results.jsonl');
    const child = run(file, out);
    const { code } = await child.exited;
    expect(code, child.output()).to.equal(0);
    expect(child.output()).to.match(/submitted 2000\/2000 +running 0 +succeeded 2000 +failed 0/);
    const results = fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(results.map((r) => r.custom_id)).to.deep.equal(lines.map((l) => l.custom_id));
    for (const [i, r] of results.entries()) {
      expect(r.status, JSON.stringify(r)).to.equal('succeeded');
      expect(r.request_id).to.match(/^req_/);
      if (i % 100 === 0) expect(r.response).to.be.a('string').and.include('data: ');
      else expect(r.response.choices[0].message.content).to.include(`full ${i}`);
    }
    const calls = callsPerMarker('full ');
    expect(calls.size).to.equal(2000);
    expect([...calls.values()].every((n) => n === 1)).to.equal(true);
  });

  it('killed halfway with SIGKILL and started again: nothing is submitted twice, every line is collected', async () => {
    const lines = Array.from({ length: 2000 }, (_, i) => chatLine(`r${i}`, `resume ${i}`));
    const file = writeLines('resume.jsonl', lines);
    const out = path.join(dir, 'resume-results.jsonl');
    // The provider answers the last 500 lines only after the kill: the first run cannot finish.
    let afterKill!: () => void;
    const killed = new Promise<void>((r) => (afterKill = r));
    const off = provider.rule((e) => {
      const content = e.json?.messages?.[0]?.content as string | undefined;
      if (!content?.startsWith('resume ') || Number(content.slice('resume '.length)) < 1500) return undefined;
      return { kind: 'json', body: chatCompletionBody(`answer to ${content}`), after: killed };
    });
    try {
      const first = run(file, out, ['--concurrency', '8']);
      await until(async () => {
        const state = fs.existsSync(`${out}.state`) ? fs.readFileSync(`${out}.state`, 'utf8') : '';
        return state.split('\n').length > 1000 ? true : undefined;
      }, 120_000, 20);
      await first.kill('SIGKILL');
    } finally {
      afterKill();
      off();
    }
    expect(fs.existsSync(out)).to.equal(false);

    const second = run(file, out);
    const { code } = await second.exited;
    expect(code, second.output()).to.equal(0);
    const resumed = Number(/resuming: (\d+) line/.exec(second.output())?.[1]);
    expect(resumed).to.be.at.least(1000).and.below(2000);
    const results = fs.readFileSync(out, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(results.map((r) => r.custom_id)).to.deep.equal(lines.map((l) => l.custom_id));
    expect(results.every((r) => r.status === 'succeeded')).to.equal(true);
    // One provider call per line: the lines in the state file were not sent again, and the few
    // in flight at the kill (accepted, not yet recorded) attached to their requests when resent.
    const calls = callsPerMarker('resume ');
    expect(calls.size).to.equal(2000);
    expect([...calls.values()].filter((n) => n !== 1)).to.deep.equal([]);
  });
});
