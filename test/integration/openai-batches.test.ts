// OpenAI's Files and Batches APIs (issue 43) over real HTTP with the unmodified openai SDK:
// Sarsen runs the batch itself, every line an ordinary request (docs/api.md "Batches").
import { expect } from 'chai';
import OpenAI, { NotFoundError, toFile } from 'openai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatCompletionBody, type FakeProvider, type JournalEntry } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json, until } from '../support/http.ts';
import { gate } from './streaming-support.ts';
import { call } from '../support/control-plane.ts';
import { runRetentionSweep } from '../../src/executor/retention.ts';
import { setSetting } from '../../src/config/settings.ts';

type Line = { id: string; custom_id: string; response: { status_code: number; request_id: string | null; body: unknown } | null; error: { code: string; message: string } | null };

/** The raw bytes of each result line's response body, by custom_id (the text between `"body":` and the line's end). */
function rawBodies(text: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const line of text.split('\n').filter(Boolean)) {
    const m = /^\{"id":"[^"]+","custom_id":("(?:[^"\\]|\\.)*"),"response":\{"status_code":\d+,"request_id":(?:"[^"]*"|null),"body":(.*)\},"error":.*\}$/.exec(line);
    if (m) out.set(JSON.parse(m[1]!) as string, m[2]!);
  }
  return out;
}

const lines = (text: string): Line[] => text.split('\n').filter(Boolean).map((l) => JSON.parse(l) as Line);

describe('OpenAI batches', function () {
  this.timeout(90_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  let other: Tenant;
  let unique = 0;
  const marker = () => `batch-${process.pid}-${++unique}`;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer({ settings: { retry_base_ms: 20, retry_max_ms: 50, batch_lines_in_flight: 2 } });
    t = await provision(server, provider);
    other = await provision(server, provider, { namespace: 'elsewhere' });
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });
  beforeEach(() => provider.reset());

  const client = (tenant = t) => new OpenAI({ baseURL: tenant.base, apiKey: tenant.key, maxRetries: 0 });
  const chatLine = (customId: string, content: string, extra: Record<string, unknown> = {}) =>
    JSON.stringify({ custom_id: customId, method: 'POST', url: '/v1/chat/completions', body: { model: 'gpt-test', messages: [{ role: 'user', content }], ...extra } });
  const upload = async (text: string, tenant = t) => client(tenant).files.create({ file: await toFile(Buffer.from(text), 'input.jsonl'), purpose: 'batch' });
  const content = async (id: string, tenant = t) => Buffer.from(await (await client(tenant).files.content(id)).arrayBuffer()).toString('utf8');
  const ended = (id: string, status: string) =>
    until(async () => {
      const b = await client().batches.retrieve(id);
      return b.status === status ? b : undefined;
    }, 60_000);
  const contentOf = (e: JournalEntry) => e.json?.messages?.[0]?.content as string | undefined;

  it('a batch of a few lines completes: one result per custom_id, each body the provider\'s answer byte for byte', async () => {
    const m = marker();
    // Answers spelled unusually (spacing, key order), so a re-serialisation would show.
    const answers = new Map<string, string>();
    provider.rule((e) => {
      const text = contentOf(e);
      if (!text?.startsWith(m)) return undefined;
      const body = `{ "id":"chatcmpl-${text}",  "object":"chat.completion","created":1,"model":"gpt-test","choices":[{"index":0,"message":{"role":"assistant","content":"answer to ${text} \\u00e9"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7} }`;
      answers.set(text, body);
      return { kind: 'json', body };
    });
    const input = [chatLine('a', `${m}-a`), chatLine('b', `${m}-b`), '', chatLine('c', `${m}-c`)].join('\n') + '\n';
    const file = await upload(input);
    expect(file).to.include({ object: 'file', purpose: 'batch', bytes: Buffer.byteLength(input), filename: 'input.jsonl', status: 'processed' });
    expect(file.id).to.match(/^file-/);
    // The input is kept byte for byte.
    expect(await content(file.id)).to.equal(input);
    expect((await client().files.retrieve(file.id)).bytes).to.equal(Buffer.byteLength(input));

    const created = await client().batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h', metadata: { m } });
    expect(created).to.include({ object: 'batch', endpoint: '/v1/chat/completions', input_file_id: file.id, completion_window: '24h' });
    expect(created.id).to.match(/^batch_/);
    expect(created.metadata).to.deep.equal({ m });
    expect(['in_progress', 'finalizing', 'completed']).to.include(created.status);
    expect(created.request_counts!.total).to.equal(3);

    const done = await ended(created.id, 'completed');
    expect(done.request_counts).to.deep.equal({ total: 3, completed: 3, failed: 0 });
    expect(done.error_file_id).to.equal(null);
    const output = await content(done.output_file_id!);
    const results = lines(output);
    expect(results.map((r) => r.custom_id).sort()).to.deep.equal(['a', 'b', 'c']);
    const bodies = rawBodies(output);
    for (const id of ['a', 'b', 'c']) {
      expect(bodies.get(id), id).to.equal(answers.get(`${m}-${id}`));
      const r = results.find((x) => x.custom_id === id)!;
      expect(r.response!.status_code).to.equal(200);
      expect(r.error).to.equal(null);
      // Each line is a Sarsen request of the batch's key.
      const record = json(await rawRequest(`${t.base}/requests/${r.response!.request_id}`, { headers: { 'x-sarsen-key': t.key } }));
      expect(record).to.include({ status: 'succeeded', dialect: 'chat' });
    }
    expect((await client().files.retrieve(done.output_file_id!)).bytes).to.equal(Buffer.byteLength(output));
    expect(provider.journal.filter((e) => contentOf(e)?.startsWith(m))).to.have.length(3);
    const listed = await client().batches.list({ limit: 100 });
    expect(listed.data.map((b) => b.id)).to.include(created.id);
    // The listing names each line's batch; the console's routes list the batch with its progress and its lines.
    const listing = json(await rawRequest(`${t.base}/requests?limit=200`, { headers: { 'x-sarsen-key': t.key } }));
    const lineRequests = results.map((r) => r.response!.request_id);
    expect(listing.data.filter((row: { request_id: string }) => lineRequests.includes(row.request_id)).map((row: { batch_id: string }) => row.batch_id)).to.deep.equal([created.id, created.id, created.id]);
    const consoleList = await call(server.url, 'GET', `/${t.tenancy}/v1/namespaces/${t.namespace}/batches`, { token: t.adminToken });
    const row = consoleList.body.data.find((b: { id: string }) => b.id === created.id);
    expect(row).to.deep.include({ vendor: 'openai', status: 'completed', total: 3, counts: { waiting: 0, running: 0, succeeded: 3, failed: 0, refused: 0, canceled: 0, expired: 0 } });
    const consoleLines = await call(server.url, 'GET', `/${t.tenancy}/v1/namespaces/${t.namespace}/batches/${created.id}/lines`, { token: t.adminToken });
    expect(consoleLines.body.data.map((l: { custom_id: string; state: string }) => [l.custom_id, l.state])).to.deep.equal([['a', 'succeeded'], ['b', 'succeeded'], ['c', 'succeeded']]);
    expect((await call(server.url, 'GET', `/${other.tenancy}/v1/namespaces/${other.namespace}/batches/${created.id}/lines`, { token: other.adminToken })).status).to.equal(404);
    // Accounted like any submission: three accepted, three provider calls, three ledger events of the batch's key.
    const usage = json(await rawRequest(`${t.base}/usage`, { headers: { 'x-sarsen-key': t.key } }));
    expect(usage).to.include({ accepted_submissions: 3, provider_calls: 3 });
    expect(usage.api_keys.find((k: { api_key_id: string }) => k.api_key_id === t.apiKeyId)).to.include({ ledger_events: 3 });
    // The input file counts in storage, beside the contract's sum, which it leaves as it is.
    const storage = json(await rawRequest(`${t.base}/storage`, { headers: { 'x-sarsen-key': t.key } }));
    expect(storage.file_bytes).to.be.at.least(Buffer.byteLength(input));
    expect(storage.stored_bytes, 'stored_bytes is request + response + chunk bytes').to.equal(storage.request_bytes + storage.response_bytes + storage.chunk_bytes);
  });

  it('a refused line lands in the error file with the provider\'s status and body; a line Sarsen refuses, with Sarsen\'s code', async () => {
    const m = marker();
    const refusal = `{"error":{"message":"no thanks ${m}","type":"invalid_request_error","param":null,"code":"refused"}}`;
    provider.rule((e) => (contentOf(e) === `${m}-refuse` ? { kind: 'refuse', status: 400, body: refusal } : undefined));
    const input = [
      chatLine('good', `${m}-good`),
      chatLine('refuse', `${m}-refuse`),
      JSON.stringify({ custom_id: 'unrouted', method: 'POST', url: '/v1/chat/completions', body: { model: 'nothing-routes-this', messages: [] } }),
      chatLine('stream', `${m}-stream`, { stream: true }),
    ].join('\n');
    const file = await upload(input);
    const created = await client().batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
    const done = await ended(created.id, 'completed');
    expect(done.request_counts).to.deep.equal({ total: 4, completed: 1, failed: 3 });
    expect(lines(await content(done.output_file_id!)).map((r) => r.custom_id)).to.deep.equal(['good']);
    const errorText = await content(done.error_file_id!);
    const errors = lines(errorText);
    expect(errors.map((r) => r.custom_id)).to.deep.equal(['refuse', 'unrouted', 'stream']);
    expect(errors[0]!.response!.status_code).to.equal(400);
    expect(rawBodies(errorText).get('refuse')).to.equal(refusal);
    expect(errors[1]!.response!.status_code).to.equal(404);
    expect(errors[1]!.error!.code).to.equal('not_found');
    expect(errors[2]!.response!.status_code).to.equal(400);
    expect(errors[2]!.error!.code).to.equal('bad_request');
  });

  it('an invalid input file fails validation with the lines named', async () => {
    const input = [chatLine('a', 'x'), '{not json', JSON.stringify({ custom_id: 'c', method: 'POST', url: '/v1/responses', body: {} }), chatLine('a', 'y')].join('\n');
    const file = await upload(input);
    const created = await client().batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
    expect(created.status).to.equal('failed');
    expect(created.errors!.data!.map((e) => [e.line, e.code])).to.deep.equal([[2, 'invalid_json_line'], [3, 'mismatched_endpoint']]);
    const dup = await client().batches.create({ input_file_id: (await upload([chatLine('a', 'x'), chatLine('a', 'y')].join('\n'))).id, endpoint: '/v1/chat/completions', completion_window: '24h' });
    expect(dup.status).to.equal('failed');
    expect(dup.errors!.data!.map((e) => [e.line, e.code])).to.deep.equal([[2, 'duplicate_custom_id']]);
  });

  it('cancel mid-batch ends cancelled, with partial results and the counts adding up', async () => {
    const m = marker();
    const held = gate();
    provider.rule((e) => (contentOf(e)?.startsWith(m) ? { kind: 'json', body: chatCompletionBody(`done ${contentOf(e)}`), after: held.until } : undefined));
    const input = Array.from({ length: 10 }, (_, i) => chatLine(`line-${i}`, `${m}-${i}`)).join('\n');
    const created = await client().batches.create({ input_file_id: (await upload(input)).id, endpoint: '/v1/chat/completions', completion_window: '24h' });
    // Two lines in flight at most (batch_lines_in_flight): the others wait.
    await provider.waitUntil(() => provider.journal.filter((e) => contentOf(e)?.startsWith(m)).length === 2);
    const cancelling = await client().batches.cancel(created.id);
    expect(cancelling.status).to.equal('cancelling');
    held.open();
    const done = await ended(created.id, 'cancelled');
    expect(done.cancelled_at).to.be.a('number');
    expect(done.request_counts).to.deep.equal({ total: 10, completed: 2, failed: 8 });
    expect(lines(await content(done.output_file_id!))).to.have.length(2);
    const errors = lines(await content(done.error_file_id!));
    expect(errors).to.have.length(8);
    expect(errors.every((e) => e.error!.code === 'batch_cancelled' && e.response === null)).to.equal(true);
    expect(provider.journal.filter((e) => contentOf(e)?.startsWith(m))).to.have.length(2);
  });

  it('a line that outlives its window ends expired', async () => {
    const m = marker();
    const held = gate();
    provider.rule((e) => (contentOf(e)?.startsWith(m) ? { kind: 'json', body: chatCompletionBody('late'), after: held.until } : undefined));
    const input = Array.from({ length: 5 }, (_, i) => chatLine(`line-${i}`, `${m}-${i}`)).join('\n');
    // Sarsen takes windows shorter than the vendor's 24h (docs/api.md "Batches").
    const created = await client().batches.create({ input_file_id: (await upload(input)).id, endpoint: '/v1/chat/completions', completion_window: '2s' as '24h' });
    await provider.waitUntil(() => provider.journal.filter((e) => contentOf(e)?.startsWith(m)).length === 2);
    await until(async () => ((await client().batches.retrieve(created.id)).expired_at ? true : undefined), 30_000);
    held.open();
    const done = await ended(created.id, 'expired');
    expect(done.request_counts).to.deep.equal({ total: 5, completed: 2, failed: 3 });
    const errors = lines(await content(done.error_file_id!));
    expect(errors.map((e) => e.error!.code)).to.deep.equal(['batch_expired', 'batch_expired', 'batch_expired']);
  });

  it('another namespace\'s batch or file is 404', async () => {
    const file = await upload(chatLine('a', marker()));
    const created = await client().batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
    const elsewhere = client(other);
    for (const call of [
      () => elsewhere.batches.retrieve(created.id),
      () => elsewhere.batches.cancel(created.id),
      () => elsewhere.files.retrieve(file.id),
      () => elsewhere.files.content(file.id),
      () => elsewhere.files.delete(file.id),
      () => elsewhere.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' }),
    ]) {
      let caught: unknown;
      await call().catch((err: unknown) => (caught = err));
      expect(caught).to.be.instanceOf(NotFoundError);
    }
    expect((await elsewhere.batches.list()).data.map((b) => b.id)).to.not.include(created.id);
    expect((await elsewhere.files.list()).data.map((f) => f.id)).to.not.include(file.id);
    expect(await client().files.delete(file.id)).to.deep.equal({ id: file.id, object: 'file', deleted: true });
  });
  it('files, batches and their results are retired by the namespace\'s retention and leave GET /storage', async () => {
    const r = await provision(server, provider, { namespace: 'retained' });
    const input = chatLine('a', marker());
    const file = await upload(input, r);
    const created = await client(r).batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
    await until(async () => ((await client(r).batches.retrieve(created.id)).status === 'completed' ? true : undefined), 60_000);
    const storage = async () => json(await rawRequest(`${r.base}/storage`, { headers: { 'x-sarsen-key': r.key } }));
    expect((await storage()).file_bytes).to.equal(Buffer.byteLength(input));
    expect((await call(server.url, 'PATCH', `/${r.tenancy}/v1/namespaces/${r.namespace}`, { token: r.adminToken, body: { retention_minutes: 60 } })).status).to.equal(200);
    // Younger than the retention: kept.
    await runRetentionSweep(server);
    expect((await client(r).files.retrieve(file.id)).id).to.equal(file.id);
    // Older: gone, with the batch and its output file.
    await server.pool.query(`UPDATE sarsen.files SET created_at = now() - interval '2 hours' WHERE namespace_id = $1`, [r.namespaceId]);
    await server.pool.query(`UPDATE sarsen.batches SET created_at = now() - interval '2 hours', ended_at = now() - interval '2 hours' WHERE namespace_id = $1`, [r.namespaceId]);
    await runRetentionSweep(server);
    for (const gone of [() => client(r).files.retrieve(file.id), () => client(r).batches.retrieve(created.id)]) {
      let caught: unknown;
      await gone().catch((err: unknown) => (caught = err));
      expect(caught).to.be.instanceOf(NotFoundError);
    }
    expect((await client(r).files.list()).data).to.deep.equal([]);
    expect((await storage()).file_bytes).to.equal(0);
  });
  it('after retention sweeps the lines\' answers, each stays in its file as record_expired, and the files\' bytes and the counts still describe the files', async () => {
    const r = await provision(server, provider, { namespace: 'answers-swept' });
    const m = marker();
    provider.rule((e) => (contentOf(e) === `${m}-refuse` ? { kind: 'refuse', status: 400, body: `{"error":{"message":"no ${m}","code":"refused"}}` } : undefined));
    const input = [chatLine('good', `${m}-good`), chatLine('refuse', `${m}-refuse`), chatLine('unrouted', m, { model: 'no-such-model' })].join('\n');
    const created = await client(r).batches.create({ input_file_id: (await upload(input, r)).id, endpoint: '/v1/chat/completions', completion_window: '24h' });
    const done = await until(async () => {
      const b = await client(r).batches.retrieve(created.id);
      return b.status === 'completed' ? b : undefined;
    }, 60_000);
    const files = async () => {
      const out: Record<'output' | 'error', { text: string; bytes: number }> = {} as never;
      for (const [kind, id] of [['output', done.output_file_id!], ['error', done.error_file_id!]] as const) {
        out[kind] = { text: await content(id, r), bytes: (await client(r).files.retrieve(id)).bytes };
      }
      return out;
    };
    const before = await files();
    expect(done.request_counts).to.deep.equal({ total: 3, completed: 1, failed: 2 });
    expect(lines(before.output.text).map((l) => l.custom_id)).to.deep.equal(['good']);
    expect(lines(before.error.text).map((l) => l.custom_id)).to.deep.equal(['refuse', 'unrouted']);
    for (const f of Object.values(before)) expect(f.bytes).to.equal(Buffer.byteLength(f.text));

    // The answers pass the namespace's retention; the batch itself does not.
    expect((await call(server.url, 'PATCH', `/${r.tenancy}/v1/namespaces/${r.namespace}`, { token: r.adminToken, body: { retention_minutes: 60 } })).status).to.equal(200);
    await server.pool.query(`UPDATE sarsen.requests SET finished_at = now() - interval '2 hours' WHERE namespace_id = $1`, [r.namespaceId]);
    expect((await runRetentionSweep(server)).records).to.be.at.least(2);

    const after = await files();
    const batch = await client(r).batches.retrieve(created.id);
    expect(batch.request_counts).to.deep.equal({ total: 3, completed: 1, failed: 2 });
    const [good] = lines(after.output.text);
    expect(good).to.deep.include({ custom_id: 'good', error: { code: 'record_expired', message: 'The line ran, but its stored answer was removed by retention.' } });
    expect(good!.response!.status_code).to.equal(410);
    expect(lines(after.error.text).map((l) => [l.custom_id, l.error?.code])).to.deep.equal([['refuse', 'record_expired'], ['unrouted', 'not_found']]);
    for (const f of Object.values(after)) expect(f.bytes).to.equal(Buffer.byteLength(f.text));
    expect(after.output.bytes).to.be.below(before.output.bytes);
  });
  it('with metering on, a line the tenancy has no credit for fails as that line, 402 insufficient_credits', async () => {
    await setSetting(server.pool, 'metering_enabled', 'true');
    await server.settings.refresh();
    try {
      const m = marker();
      const created = await client().batches.create({ input_file_id: (await upload(chatLine('broke', m))).id, endpoint: '/v1/chat/completions', completion_window: '24h' });
      const done = await ended(created.id, 'completed');
      expect(done.request_counts).to.deep.equal({ total: 1, completed: 0, failed: 1 });
      const [line] = lines(await content(done.error_file_id!));
      expect(line!.response!.status_code).to.equal(402);
      expect(line!.error!.code).to.equal('insufficient_credits');
      expect(provider.journal.filter((e) => contentOf(e) === m)).to.have.length(0);
    } finally {
      await setSetting(server.pool, 'metering_enabled', 'false');
      await server.settings.refresh();
    }
  });
  it('identical lines in one batch attach to one execution: one provider call, a result for each custom_id', async () => {
    const m = marker();
    const input = [chatLine('same-1', m), chatLine('same-2', m), chatLine('other', `${m}-other`)].join('\n');
    const created = await client().batches.create({ input_file_id: (await upload(input)).id, endpoint: '/v1/chat/completions', completion_window: '24h' });
    const done = await ended(created.id, 'completed');
    expect(done.request_counts).to.deep.equal({ total: 3, completed: 3, failed: 0 });
    const output = await content(done.output_file_id!);
    const results = lines(output);
    const byId = new Map(results.map((r) => [r.custom_id, r]));
    expect(byId.get('same-1')!.response!.request_id).to.equal(byId.get('same-2')!.response!.request_id);
    expect(byId.get('other')!.response!.request_id).to.not.equal(byId.get('same-1')!.response!.request_id);
    expect(rawBodies(output).get('same-1')).to.equal(rawBodies(output).get('same-2'));
    expect(provider.journal.filter((e) => contentOf(e) === m)).to.have.length(1);
  });
  it('lines run at the pace the key\'s rate limit allows: over it, the batch waits instead of failing lines', async () => {
    const made = await call(server.url, 'POST', `/${t.tenancy}/v1/namespaces/${t.namespace}/api-keys`, { token: t.adminToken, body: { name: `limited-${marker()}`, grants: ['use'], limits: { requests_per_minute: 2 } } });
    expect(made.status).to.equal(201);
    const limited = { ...t, key: made.body.key as string };
    const m = marker();
    const input = Array.from({ length: 4 }, (_, i) => chatLine(`r${i}`, `${m}-${i}`)).join('\n');
    const created = await client(limited).batches.create({ input_file_id: (await upload(input, limited)).id, endpoint: '/v1/chat/completions', completion_window: '24h' });
    // Two lines fit the key's minute; the others wait, none fails. (The counts are read from the
    // requests, so the two can complete before the dispatcher's next round meets the limit.)
    await until(async () => ((await client(limited).batches.retrieve(created.id)).request_counts!.completed === 2 ? true : undefined));
    const paused = async () => (await server.pool.query(`SELECT paused_until > now() AS paused FROM sarsen.batches WHERE id = $1`, [created.id])).rows[0].paused as boolean | null;
    await until(async () => ((await paused()) === true ? true : undefined));
    const now = await client(limited).batches.retrieve(created.id);
    expect(now.status).to.equal('in_progress');
    expect(now.request_counts).to.deep.equal({ total: 4, completed: 2, failed: 0 });
    expect(provider.journal.filter((e) => contentOf(e)?.startsWith(m))).to.have.length(2);
    // The next minute would run them; a cancel ends the test sooner.
    await client(limited).batches.cancel(created.id);
    expect((await ended(created.id, 'cancelled')).request_counts).to.deep.equal({ total: 4, completed: 2, failed: 2 });
  });
  it('a /v1/responses batch runs each line on the Responses route of a chat backend', async () => {
    const m = marker();
    const line = JSON.stringify({ custom_id: 'resp', method: 'POST', url: '/v1/responses', body: { model: 'gpt-test', input: m } });
    const created = await client().batches.create({ input_file_id: (await upload(line)).id, endpoint: '/v1/responses', completion_window: '24h' });
    const done = await ended(created.id, 'completed');
    expect(done.request_counts).to.deep.equal({ total: 1, completed: 1, failed: 0 });
    const [result] = lines(await content(done.output_file_id!));
    expect((result!.response!.body as { object: string }).object).to.equal('response');
    expect(provider.journal.filter((e) => e.json?.input === m).map((e) => e.path)).to.deep.equal(['/v1/responses']);
  });
  it('a file over batch_file_max_bytes is refused 413 and nothing is kept', async () => {
    await setSetting(server.pool, 'batch_file_max_bytes', '4096');
    await server.settings.refresh();
    try {
      const before = (await client().files.list()).data.length;
      let caught: unknown;
      await upload(`${chatLine('a', 'x'.repeat(8192))}\n`).catch((err: unknown) => (caught = err));
      expect((caught as { status?: number }).status).to.equal(413);
      expect((await client().files.list()).data.length).to.equal(before);
    } finally {
      await setSetting(server.pool, 'batch_file_max_bytes', '209715200');
      await server.settings.refresh();
    }
  });
  it('lists batches and files with the vendor\'s pagination, which the SDK follows page by page', async () => {
    const p = await provision(server, provider, { namespace: 'paged' });
    const made: string[] = [];
    const files: string[] = [];
    for (let i = 0; i < 3; i++) {
      const file = await upload(chatLine(`p${i}`, marker()), p);
      files.push(file.id);
      made.push((await client(p).batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' })).id);
    }
    const first = await client(p).batches.list({ limit: 2 });
    expect(first.data.map((b) => b.id)).to.deep.equal([made[2], made[1]]);
    expect(first.has_more).to.equal(true);
    const seen: string[] = [];
    for await (const b of client(p).batches.list({ limit: 1 })) seen.push(b.id);
    expect(seen).to.deep.equal([...made].reverse());
    const seenFiles: string[] = [];
    for await (const f of client(p).files.list({ limit: 1, order: 'asc' })) seenFiles.push(f.id);
    expect(seenFiles.filter((id) => files.includes(id))).to.deep.equal(files);
  });
  it('a revoked key\'s remaining lines are refused 401 as its calls would be; lines in flight end', async () => {
    const made = await call(server.url, 'POST', `/${t.tenancy}/v1/namespaces/${t.namespace}/api-keys`, { token: t.adminToken, body: { name: `revoked-${marker()}`, grants: ['use'] } });
    const doomed = { ...t, key: made.body.key as string };
    const m = marker();
    const held = gate();
    provider.rule((e) => (contentOf(e)?.startsWith(m) ? { kind: 'json', body: chatCompletionBody('in flight'), after: held.until } : undefined));
    const input = Array.from({ length: 4 }, (_, i) => chatLine(`k${i}`, `${m}-${i}`)).join('\n');
    const created = await client(doomed).batches.create({ input_file_id: (await upload(input, doomed)).id, endpoint: '/v1/chat/completions', completion_window: '24h' });
    await provider.waitUntil(() => provider.journal.filter((e) => contentOf(e)?.startsWith(m)).length === 2);
    expect((await call(server.url, 'DELETE', `/${t.tenancy}/v1/namespaces/${t.namespace}/api-keys/${made.body.api_key_id}`, { token: t.adminToken })).status).to.be.below(300);
    held.open();
    const done = await ended(created.id, 'completed');
    expect(done.request_counts).to.deep.equal({ total: 4, completed: 2, failed: 2 });
    const errors = lines(await content(done.error_file_id!));
    expect(errors.map((e) => [e.response!.status_code, e.error!.code])).to.deep.equal([[401, 'unauthorised'], [401, 'unauthorised']]);
  });
  it('a backend\'s 429 with retry-after is honoured: the line is retried after it and succeeds', async () => {
    const m = marker();
    let refused = 0;
    // 3 s, not 1: a retry that ignored it would come about 1 s later anyway, at the worker's
    // next poll for due jobs (pollInterval), and be taken for one that honoured it.
    provider.rule((e) => (contentOf(e) === m && refused++ === 0 ? { kind: 'refuse', status: 429, retryAfter: '3', body: { error: { message: 'slow down', type: 'rate_limit_error' } } } : undefined));
    const created = await client().batches.create({ input_file_id: (await upload(chatLine('busy', m))).id, endpoint: '/v1/chat/completions', completion_window: '24h' });
    const done = await ended(created.id, 'completed');
    expect(done.request_counts).to.deep.equal({ total: 1, completed: 1, failed: 0 });
    const calls = provider.journal.filter((e) => contentOf(e) === m);
    expect(calls).to.have.length(2);
    // The 429 was answered after its call arrived, so an honoured retry-after puts the retry at
    // least 3 s after that arrival; the upper side is loose, only to catch a retry that waited
    // for something else entirely.
    const gap = calls[1]!.receivedAt - calls[0]!.receivedAt;
    expect(gap, 'ms from the 429\'s call to the retry').to.be.at.least(3000).and.below(30_000);
    // One request, retried by Sarsen's own retries (which honour Retry-After: docs/api.md "Outcomes and retries").
    const [result] = lines(await content(done.output_file_id!));
    const record = json(await rawRequest(`${t.base}/requests/${result!.response!.request_id}`, { headers: { 'x-sarsen-key': t.key } }));
    expect(record).to.include({ status: 'succeeded', attempts: 2 });
  });
});
