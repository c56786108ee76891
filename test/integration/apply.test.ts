// `sarsen apply`: create, a re-apply that changes nothing, a change, prune, dry run, and every
// class of error in a file; a key it issues then works against the proxy.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import OpenAI from 'openai';
import { applyCommand } from '../../src/cli/apply.ts';
import type { OpenDatabase } from '../../src/cli/database.ts';
import { ConfigError } from '../../src/config/config.ts';
import { createTestDatabase, testPool, type TestDatabase } from '../support/db.ts';
import { startTestServer, testSecrets, type TestServer } from '../support/server.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { createTenancy } from '../support/control-plane.ts';
import { registerSecret } from '../support/log-guard.ts';
import { storeSetting } from '../../src/db/settings.ts';

describe('sarsen apply', function () {
  this.timeout(60_000);
  let db: TestDatabase;
  let pool: ReturnType<typeof testPool>;
  let dir: string;
  let provider: FakeProvider;
  const secrets = testSecrets();
  const env: NodeJS.ProcessEnv = { CHAT_KEY: 'sk-chat-from-env-1', ANT_KEY: 'sk-ant-from-env-1' };
  for (const v of Object.values(env)) registerSecret(v!);

  before(async () => {
    db = await createTestDatabase();
    pool = testPool(db.conn);
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sarsen-apply-'));
    provider = await startFakeProvider();
    await createTenancy(pool, 'acme');
  });
  after(async () => {
    await provider?.close();
    fs.rmSync(dir, { recursive: true, force: true });
    await pool?.end();
    await db?.drop();
  });

  const open = (): OpenDatabase => ({ conn: db.conn, secrets, close: async () => {} });
  const write = (name: string, content: string | object) => {
    const file = path.join(dir, name);
    fs.writeFileSync(file, typeof content === 'string' ? content : JSON.stringify(content));
    return file;
  };
  const apply = async (file: string, opts: { prune?: boolean; dryRun?: boolean; passthrough?: boolean; env?: NodeJS.ProcessEnv } = {}) => {
    const lines: string[] = [];
    await applyCommand(open(), [file], { prune: opts.prune ?? false, dryRun: opts.dryRun ?? false, credentialPassthrough: opts.passthrough ?? false, env: opts.env ?? env }, (l) => lines.push(l));
    return lines;
  };
  const failure = async (file: string, opts: Parameters<typeof apply>[1] = {}) => {
    try {
      await apply(file, opts);
    } catch (err) {
      expect(err).to.be.instanceOf(ConfigError);
      return (err as Error).message;
    }
    throw new Error('apply did not fail');
  };
  const state = async () => {
    const q = async (sql: string) => (await pool.query(sql)).rows;
    return {
      namespaces: await q(`SELECT n.name, n.retention_minutes FROM sarsen.namespaces n JOIN sarsen.tenancies t ON t.id = n.tenancy_id WHERE t.slug = 'acme' ORDER BY n.name`),
      backends: await q(`SELECT b.name, b.address, b.kind FROM sarsen.backends b ORDER BY b.name`),
      rules: await q(`SELECT r.model, r.priority, r.action, b.name AS backend FROM sarsen.routing_rules r LEFT JOIN sarsen.backends b ON b.id = r.backend_id ORDER BY r.model`),
      keys: await q(`SELECT name, grants, revoked_at IS NOT NULL AS revoked FROM sarsen.api_keys ORDER BY created_at, name`),
    };
  };

  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  type Cfg = { tenancy: string; namespaces: { name: string; retention_minutes?: number; backends: any[]; routing_rules: any[]; api_keys: any[] }[] };
  const base = (): Cfg => ({
    tenancy: 'acme',
    namespaces: [
      {
        name: 'prod',
        backends: [
          { name: 'chat', kind: 'chat_compat', address: `${provider.url}/v1`, credential: 'env:CHAT_KEY' },
          { name: 'claude', kind: 'messages', address: provider.url, credential: 'env:ANT_KEY' },
        ],
        routing_rules: [
          { model: 'gpt-*', backend: 'chat' },
          { model: 'claude-*', backend: 'claude' },
          { model: 'banned-*', action: 'decline' },
        ],
        api_keys: [{ name: 'ci', grants: ['use'] }],
      },
      { name: 'staging', retention_minutes: 60, backends: [], routing_rules: [], api_keys: [] },
    ],
  });

  it('creates what the file declares, prints the keys it issues once, and a key then works through the proxy', async () => {
    const yaml = `# the same as JSON, in YAML
tenancy: acme
namespaces:
  - name: prod
    backends:
      - { name: chat, kind: chat_compat, address: "${provider.url}/v1", credential: "env:CHAT_KEY" }
      - { name: claude, kind: messages, address: "${provider.url}", credential: "env:ANT_KEY" }
    routing_rules:
      - { model: "gpt-*", backend: chat }
      - { model: "claude-*", backend: claude }
      - { model: "banned-*", action: decline }
    api_keys:
      - { name: ci, grants: [use] }
  - name: staging
    retention_minutes: 60
`;
    const lines = await apply(write('acme.yaml', yaml));
    expect(lines[0]).to.equal('tenancy acme: 8 changes, 0 unchanged');
    expect(lines).to.include.members(['+ namespace prod', '+ namespace staging', '+ backend prod/chat', '+ routing rule prod/gpt-*', '+ api key prod/ci', 'applied']);
    const keyLine = lines.find((l) => l.startsWith('key prod/ci: '))!;
    const key = keyLine.slice('key prod/ci: '.length);
    registerSecret(key);
    expect(key).to.match(/^sar_/);
    expect(lines.join('\n')).to.not.include('sk-chat-from-env-1'); // credentials are never printed
    const s = await state();
    expect(s.namespaces).to.deep.equal([{ name: 'prod', retention_minutes: null }, { name: 'staging', retention_minutes: 60 }]);
    expect(s.rules.map((r) => `${r.model}>${r.backend ?? r.action}`)).to.deep.equal(['banned-*>decline', 'claude-*>claude', 'gpt-*>chat']);

    const server: TestServer = await startTestServer({ db, secrets });
    try {
      const client = new OpenAI({ baseURL: `${server.url}/acme/prod/v1`, apiKey: key, maxRetries: 0 });
      const answer = await client.chat.completions.create({ model: 'gpt-x', messages: [{ role: 'user', content: 'via apply' }] });
      expect(answer.choices[0]!.message.content).to.include('via apply');
      expect(provider.journal.at(-1)!.headers.authorization).to.equal('Bearer sk-chat-from-env-1'); // the referenced credential, sealed and used
    } finally {
      await server.close();
    }
  });

  it('applying the same file again changes nothing (YAML or the same content as JSON)', async () => {
    for (const file of [path.join(dir, 'acme.yaml'), write('acme.json', base())]) {
      const lines = await apply(file);
      expect(lines).to.deep.equal(['tenancy acme: 0 changes, 8 unchanged']);
    }
  });

  it('--dry-run prints the plan and changes nothing', async () => {
    const cfg = base();
    cfg.namespaces[1]!.retention_minutes = 120;
    const before = await state();
    const lines = await apply(write('dry.json', cfg), { dryRun: true });
    expect(lines).to.deep.equal(['tenancy acme: 1 change, 7 unchanged (dry run: nothing is changed)', '~ namespace staging (retention_minutes)']);
    expect(await state()).to.deep.equal(before);
  });

  it('changes what differs: fields, a credential, a rule, and re-issues a key whose grants changed', async () => {
    const cfg = base();
    cfg.namespaces[1]!.retention_minutes = 120;
    cfg.namespaces[0]!.backends[0]!.address = `${provider.url}/v2`;
    cfg.namespaces[0]!.routing_rules[0] = { model: 'gpt-*', backend: 'chat', priority: 5 } as never;
    cfg.namespaces[0]!.api_keys[0]!.grants = ['use', 'manage'];
    registerSecret('sk-ant-from-env-2');
    const lines = await apply(write('change.json', cfg), { env: { ...env, ANT_KEY: 'sk-ant-from-env-2' } });
    expect(lines.slice(0, 6)).to.deep.equal([
      'tenancy acme: 5 changes, 3 unchanged',
      '~ namespace staging (retention_minutes)',
      '~ backend prod/chat (address)',
      '~ backend prod/claude (credential)',
      '~ routing rule prod/gpt-* (priority)',
      '± api key prod/ci (grants) (revoked, and a new key issued)',
    ]);
    registerSecret(lines.find((l) => l.startsWith('key prod/ci: '))!.slice(13));
    const s = await state();
    expect(s.namespaces[1].retention_minutes).to.equal(120);
    expect(s.backends.find((b) => b.name === 'chat').address).to.equal(`${provider.url}/v2`);
    expect(s.rules.find((r) => r.model === 'gpt-*').priority).to.equal(5);
    expect(s.keys.map((k) => `${k.name}:${k.grants.join('+')}:${k.revoked}`)).to.deep.equal(['ci:use:true', 'ci:use+manage:false']);
    expect(await apply(write('change.json', cfg), { env: { ...env, ANT_KEY: 'sk-ant-from-env-2' } })).to.deep.equal(['tenancy acme: 0 changes, 8 unchanged']);
  });

  it('--prune removes what the file no longer names; without it nothing is removed', async () => {
    const cfg = base();
    cfg.namespaces[1]!.retention_minutes = 120;
    cfg.namespaces[0]!.backends[0]!.address = `${provider.url}/v2`;
    cfg.namespaces[0]!.routing_rules = [{ model: 'gpt-*', backend: 'chat', priority: 5 } as never];
    cfg.namespaces[0]!.backends.pop(); // claude, and its rule
    cfg.namespaces[0]!.api_keys = [];
    cfg.namespaces.pop(); // staging
    const file = write('prune.json', cfg);
    const env2 = { ...env, ANT_KEY: 'sk-ant-from-env-2' };
    expect(await apply(file, { env: env2 })).to.deep.equal(['tenancy acme: 0 changes, 3 unchanged']);
    const lines = await apply(file, { prune: true, env: env2 });
    expect(lines).to.deep.equal([
      'tenancy acme: 5 changes, 3 unchanged',
      '- routing rule prod/banned-*',
      '- routing rule prod/claude-*',
      '- backend prod/claude',
      '- api key prod/ci (revoked)',
      '- namespace staging',
      'applied',
    ]);
    const s = await state();
    expect(s.namespaces.map((n) => n.name)).to.deep.equal(['prod']);
    expect(s.backends.map((b) => b.name)).to.deep.equal(['chat']);
    expect(s.rules.map((r) => r.model)).to.deep.equal(['gpt-*']);
    expect(s.keys.every((k) => k.revoked)).to.equal(true);
    expect(await apply(file, { prune: true, env: env2 })).to.deep.equal(['tenancy acme: 0 changes, 3 unchanged']);
  });

  it('names the path in the file for every class of error, and changes nothing', async () => {
    const before = await state();
    const cases: [string, string | object, RegExp, Parameters<typeof apply>[1]?][] = [
      ['syntax', 'tenancy: acme\nnamespaces: [ {name: prod\n', /line \d+, column \d+/],
      ['unknown field', { tenancy: 'acme', namespaces: [{ name: 'prod', colour: 'red' }] }, /namespaces\[0\]: unknown field "colour"/],
      ['wrong type', { tenancy: 'acme', namespaces: [{ name: 'prod', retention_minutes: 'long' }] }, /namespaces\[0\]\.retention_minutes: /],
      ['missing field', { tenancy: 'acme', namespaces: [{ name: 'prod', backends: [{ name: 'x', address: 'https://a.example' }] }] }, /namespaces\[0\]\.backends\[0\]\.kind: /],
      ['bad slug', { tenancy: 'acme', namespaces: [{ name: 'V1!' }] }, /namespaces\[0\]\.name: /],
      ['inline credential', { tenancy: 'acme', namespaces: [{ name: 'prod', backends: [{ name: 'x', kind: 'chat_compat', address: 'https://a.example', credential: 'sk-live-123' }] }] }, /namespaces\[0\]\.backends\[0\]\.credential: must be a reference/],
      ['duplicate name', { tenancy: 'acme', namespaces: [{ name: 'prod' }, { name: 'prod' }] }, /namespaces\[1\]: repeats the name "prod"/],
      ['duplicate rule', { tenancy: 'acme', namespaces: [{ name: 'prod', routing_rules: [{ model: 'a', action: 'decline' }, { model: 'a', action: 'decline' }] }] }, /namespaces\[0\]\.routing_rules\[1\]: repeats the model "a"/],
      ['bad grants', { tenancy: 'acme', namespaces: [{ name: 'prod', api_keys: [{ name: 'k', grants: ['manage'] }] }] }, /namespaces\[0\]\.api_keys\[0\]\.grants: /],
      ['unset env', { tenancy: 'acme', namespaces: [{ name: 'prod', backends: [{ name: 'x', kind: 'chat_compat', address: 'https://a.example', credential: 'env:NOT_SET_ANYWHERE' }] }] }, /namespaces\[0\]\.backends\[0\]\.credential: the environment variable NOT_SET_ANYWHERE is not set/],
      ['missing credential file', { tenancy: 'acme', namespaces: [{ name: 'prod', backends: [{ name: 'x', kind: 'chat_compat', address: 'https://a.example', credential: 'file:./nope' }] }] }, /namespaces\[0\]\.backends\[0\]\.credential: the credential file .*nope cannot be read/],
      ['bad address', { tenancy: 'acme', namespaces: [{ name: 'prod', backends: [{ name: 'x', kind: 'chat_compat', address: 'ftp://a.example' }] }] }, /namespaces\[0\]\.backends\[0\]\.address: /],
      ['unknown backend', { tenancy: 'acme', namespaces: [{ name: 'prod', routing_rules: [{ model: 'gpt-*', backend: 'nope' }] }] }, /namespaces\[0\]\.routing_rules\[0\]\.backend: no backend named "nope"/],
      ['route without backend', { tenancy: 'acme', namespaces: [{ name: 'prod', routing_rules: [{ model: 'gpt-*' }] }] }, /namespaces\[0\]\.routing_rules\[0\]\.backend: required/],
      ['caller without the switch', { tenancy: 'acme', namespaces: [{ name: 'prod', backends: [{ name: 'x', kind: 'chat_compat', address: 'https://a.example', credential_source: 'caller' }] }] }, /credential_source: caller-credential backends need --credential-passthrough/],
      ['no such tenancy', { tenancy: 'nobody', namespaces: [] }, /tenancy: no tenancy "nobody"; create it first/],
    ];
    for (const [name, content, pattern, opts] of cases) {
      const file = write(`${name.replace(/ /g, '-')}.${typeof content === 'string' ? 'yaml' : 'json'}`, content);
      const message = await failure(file, opts);
      expect(message, name).to.match(pattern);
      expect(message, name).to.include(file);
    }
    expect(await failure(path.join(dir, 'absent.yaml'))).to.match(/absent\.yaml: cannot be read \(ENOENT\)/);
    // A host the address policy refuses, with the policy on.
    await storeSetting(pool, 'backends_public_only', true);
    try {
      const refused = write('refused.json', { tenancy: 'acme', namespaces: [{ name: 'prod', backends: [{ name: 'x', kind: 'chat_compat', address: 'http://10.0.0.1' }] }] });
      expect(await failure(refused)).to.match(/namespaces\[0\]\.backends\[0\]\.address: refused, 10\.0\.0\.1 is a private address/);
    } finally {
      await storeSetting(pool, 'backends_public_only', false);
    }
    expect(await state()).to.deep.equal(before);
  });

  it('manages a rule\'s fallback backends by name, in order: plan, --dry-run, --prune, the chain checks, and rules the file does not name', async () => {
    await createTenancy(pool, 'fall');
    const chat = (name: string) => ({ name, kind: 'chat_compat', address: `${provider.url}/${name}` });
    const file = (fallbacks: string[], backends = ['primary', 'b1', 'b2'].map(chat), extra: object[] = []) =>
      write('fallbacks.json', { tenancy: 'fall', namespaces: [{ name: 'main', backends: [...backends, ...extra], routing_rules: [{ model: 'gpt-*', backend: 'primary', fallback_backends: fallbacks }] }] });
    const chain = async () =>
      (await pool.query(
        `SELECT array(SELECT b.name FROM unnest(r.fallback_backend_ids) WITH ORDINALITY f(id, n) JOIN sarsen.backends b ON b.id = f.id ORDER BY f.n) AS names
           FROM sarsen.routing_rules r JOIN sarsen.namespaces ns ON ns.id = r.namespace_id JOIN sarsen.tenancies t ON t.id = ns.tenancy_id
          WHERE t.slug = 'fall' AND r.model = 'gpt-*'`,
      )).rows[0].names as string[];

    expect((await apply(file(['b1', 'b2'])))[0]).to.equal('tenancy fall: 5 changes, 0 unchanged');
    expect(await chain()).to.deep.equal(['b1', 'b2']);
    expect(await apply(file(['b1', 'b2']))).to.deep.equal(['tenancy fall: 0 changes, 5 unchanged']);

    expect(await apply(file(['b2', 'b1']), { dryRun: true })).to.deep.equal(['tenancy fall: 1 change, 4 unchanged (dry run: nothing is changed)', '~ routing rule main/gpt-* (fallback_backends)']);
    expect(await chain()).to.deep.equal(['b1', 'b2']);
    // A fallback the same apply creates, and one dropped from the file: removed only with --prune, after the rule lets go of it.
    const withNew = file(['b2', 'b3'], ['primary', 'b2', 'b3'].map(chat));
    expect(await apply(withNew)).to.deep.equal(['tenancy fall: 2 changes, 3 unchanged', '+ backend main/b3', '~ routing rule main/gpt-* (fallback_backends)', 'applied']);
    expect(await chain()).to.deep.equal(['b2', 'b3']);
    expect(await apply(withNew, { prune: true })).to.deep.equal(['tenancy fall: 1 change, 5 unchanged', '- backend main/b1', 'applied']);

    // The administration route's checks, by path in the file; nothing is changed.
    const messages = { name: 'm', kind: 'messages', address: provider.url };
    for (const [fallbacks, pattern] of [
      [['m'], /routing_rules\[0\]\.fallback_backends\[0\]: "m" speaks messages; this rule's backend speaks chat/],
      [['b2', 'nope'], /routing_rules\[0\]\.fallback_backends\[1\]: no backend named "nope"/],
      [['b2', 'b2'], /routing_rules\[0\]\.fallback_backends\[1\]: "b2" is named twice/],
      [['primary'], /routing_rules\[0\]\.fallback_backends\[0\]: "primary" is named twice \(or is the rule's backend\)/],
    ] as const) {
      expect(await failure(file([...fallbacks], ['primary', 'b2', 'b3'].map(chat), [messages]))).to.match(pattern);
    }
    expect(await chain()).to.deep.equal(['b2', 'b3']);

    // A rule the file does not name falls back to b3: turning b3 into a messages backend is refused, naming that rule.
    const ns = (await pool.query(`SELECT ns.id FROM sarsen.namespaces ns JOIN sarsen.tenancies t ON t.id = ns.tenancy_id WHERE t.slug = 'fall'`)).rows[0].id;
    const ids = Object.fromEntries((await pool.query(`SELECT name, id FROM sarsen.backends WHERE namespace_id = $1`, [ns])).rows.map((r) => [r.name, r.id]));
    await pool.query(`INSERT INTO sarsen.routing_rules (id, namespace_id, model, backend_id, fallback_backend_ids) VALUES ('rule_outside', $1, 'outside-*', $2, $3)`, [ns, ids.primary, [ids.b3]]);
    const b3AsMessages = file(['b2'], [...['primary', 'b2'].map(chat), { ...chat('b3'), kind: 'messages' }]);
    expect(await failure(b3AsMessages)).to.match(/namespace main: After this change, routing rule "outside-\*" \(rule_outside\) would fall back from backend "primary" to "b3", which speaks messages/);
    expect(await chain()).to.deep.equal(['b2', 'b3']);
    await pool.query(`DELETE FROM sarsen.routing_rules WHERE id = 'rule_outside'`);
    expect((await apply(b3AsMessages)).slice(1, 3)).to.deep.equal(['~ backend main/b3 (kind)', '~ routing rule main/gpt-* (fallback_backends)']);
    expect(await chain()).to.deep.equal(['b2']);
  });

  it('the example file applies, and re-applies as a no-op', async () => {
    const text = fs.readFileSync(new URL('../../examples/sarsen.yaml', import.meta.url), 'utf8').replace('tenancy: default', 'tenancy: example');
    await createTenancy(pool, 'example');
    const file = write('example.yaml', text);
    const keys = { OPENAI_API_KEY: 'sk-openai-example', ANTHROPIC_API_KEY: 'sk-ant-example' };
    for (const v of Object.values(keys)) registerSecret(v);
    const lines = await apply(file, { env: keys });
    expect(lines[0]).to.equal('tenancy example: 6 changes, 0 unchanged');
    registerSecret(lines.at(-1)!.split(': ')[1]!);
    expect(await apply(file, { env: keys })).to.deep.equal(['tenancy example: 0 changes, 6 unchanged']);
  });

  it('sets a namespace\'s response cache and a key\'s rate limits; a change of limits alone keeps the key', async () => {
    await createTenancy(pool, 'paced');
    const cfg = (limits: object | undefined, cache: number | null) => ({
      tenancy: 'paced',
      namespaces: [{ name: 'main', cache_ttl_minutes: cache, api_keys: [{ name: 'batch', grants: ['use'], ...(limits ? { limits } : {}) }] }],
    });
    const issued = await apply(write('paced.json', cfg({ requests_per_minute: 60 }, 30)));
    expect(issued.slice(0, 3)).to.deep.equal(['tenancy paced: 2 changes, 0 unchanged', '+ namespace main', '+ api key main/batch']);
    registerSecret(issued.at(-1)!.split(': ')[1]!);
    const row = async () =>
      (await pool.query(
        `SELECT k.id, k.requests_per_minute, k.tokens_per_minute, n.cache_ttl_minutes FROM sarsen.api_keys k JOIN sarsen.namespaces n ON n.id = k.namespace_id
          JOIN sarsen.tenancies t ON t.id = n.tenancy_id WHERE t.slug = 'paced' AND k.revoked_at IS NULL`,
      )).rows;
    const [before] = await row();
    expect(before).to.include({ requests_per_minute: 60, tokens_per_minute: null, cache_ttl_minutes: 30 });
    expect(await apply(write('paced.json', cfg({ requests_per_minute: 60 }, 30)))).to.deep.equal(['tenancy paced: 0 changes, 2 unchanged']);

    const changed = await apply(write('paced.json', cfg({ tokens_per_minute: 9000 }, null)));
    expect(changed).to.deep.equal(['tenancy paced: 2 changes, 0 unchanged', '~ namespace main (cache_ttl_minutes)', '~ api key main/batch (limits)', 'applied']);
    const after = await row();
    expect(after).to.deep.equal([{ id: before.id, requests_per_minute: null, tokens_per_minute: 9000, cache_ttl_minutes: null }]);
    expect((await apply(write('paced.json', cfg(undefined, null)))).slice(1)).to.deep.equal(['~ api key main/batch (limits)', 'applied']);
  });
});
