// The counters as appended deltas (src/db/counters.ts, docs/accounting.md "How the counters are
// kept"): the write paths append, the watcher folds, and every read sums both in one snapshot,
// so a figure is exact however the folds and the reads interleave.
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatCompletionBody, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json } from '../support/http.ts';
import { namespaceTotals, recountStorage, usageByKey } from '../../src/db/accounting.ts';
import { foldCounters, vacuumDeltas } from '../../src/db/counters.ts';

const submit = (t: Tenant, content: string) =>
  rawRequest(`${t.base}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
    body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content }] }),
  });
const usage = async (t: Tenant) => json(await rawRequest(`${t.base}/usage`, { headers: { 'x-sarsen-key': t.key } }));

describe('counter deltas', function () {
  this.timeout(120_000);
  let provider: FakeProvider;
  let server: TestServer;

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });

  it('count each submission and answer once while two folders race the watcher and a reader reads throughout', async () => {
    const t = await provision(server, provider);
    const N = 120;
    provider.reset();
    for (let i = 0; i < N; i++) provider.enqueue({ kind: 'json', body: chatCompletionBody(`answer ${i}`, { promptTokens: 3, completionTokens: 2 }) });
    let stop = false;
    const folders = [0, 1].map(async () => {
      let folded = 0;
      while (!stop) folded += await foldCounters(server.pool);
      return folded;
    });
    const seen: number[] = [];
    const reader = (async () => {
      while (!stop) seen.push(Number((await namespaceTotals(server.pool, t.namespaceId)).accepted_submissions));
    })();
    const answers = await Promise.all(Array.from({ length: N }, (_, i) => submit(t, `delta ${i}`)));
    stop = true;
    const folded = await Promise.all(folders);
    await reader;
    for (const a of answers) expect(a.status).to.equal(200);

    expect(folded[0]! + folded[1]!, 'the racing folders folded deltas').to.be.greaterThan(0);
    // A fold that a reader could see half done would show a figure fall back.
    expect(seen.length).to.be.greaterThan(1);
    for (let i = 1; i < seen.length; i++) expect(seen[i]!, `read ${i}`).to.be.at.least(seen[i - 1]!);

    const exact = async () => {
      const totals = await namespaceTotals(server.pool, t.namespaceId);
      const stored = await recountStorage(server.pool, t.namespaceId);
      expect(Number(totals.accepted_submissions)).to.equal(N);
      expect(Number(totals.provider_calls)).to.equal(N);
      expect(Number(totals.request_bytes)).to.equal(Number(stored.request_bytes));
      expect(Number(totals.response_bytes)).to.equal(Number(stored.response_bytes));
      const u = await usage(t);
      expect(u.accepted_submissions).to.equal(N);
      expect(u.api_keys).to.deep.equal([
        { api_key_id: t.apiKeyId, ledger_events: N, provider_calls: N, prompt_tokens: 3 * N, completion_tokens: 2 * N, total_tokens: 5 * N, cache_hits: 0 },
      ]);
    };
    await exact();
    await foldCounters(server.pool);
    const { rows } = await server.pool.query<{ n: number }>(
      `SELECT (SELECT count(*) FROM sarsen.counter_deltas WHERE namespace_id = $1) + (SELECT count(*) FROM sarsen.usage_rollup_deltas WHERE namespace_id = $1)
            + (SELECT count(*) FROM sarsen.key_usage_deltas WHERE namespace_id = $1) AS n`,
      [t.namespaceId],
    );
    expect(Number(rows[0]!.n), 'deltas left after a fold').to.equal(0);
    await exact();
    await vacuumDeltas(server.pool);
    await exact();
  });

  it('are never truncated by a vacuum, whose exclusive lock would hold up every hot statement', async () => {
    const { rows } = await server.pool.query<{ relname: string; reloptions: string[] }>(
      `SELECT relname, reloptions FROM pg_class WHERE oid IN ('sarsen.counter_deltas'::regclass, 'sarsen.usage_rollup_deltas'::regclass, 'sarsen.key_usage_deltas'::regclass) ORDER BY relname`,
    );
    expect(rows.map((r) => [r.relname, r.reloptions.includes('vacuum_truncate=false')])).to.deep.equal([
      ['counter_deltas', true],
      ['key_usage_deltas', true],
      ['usage_rollup_deltas', true],
    ]);
  });

  it('fold token sums as the hourly rows keep them: null until something reports a number', async () => {
    const t = await provision(server, provider);
    const hour = (await server.pool.query<{ h: Date }>(`SELECT date_trunc('hour', now()) AS h`)).rows[0]!.h;
    const append = (prompt: number | null) =>
      server.pool.query(
        `INSERT INTO sarsen.key_usage_deltas (namespace_id, api_key_id, hour, ledger_events, prompt_tokens) VALUES ($1, $2, $3, 1, $4)`,
        [t.namespaceId, t.apiKeyId, hour, prompt],
      );
    const figures = async () => {
      const [k] = await usageByKey(server.pool, t.namespaceId, hour);
      return { events: Number(k!.ledger_events), prompt: k!.prompt_tokens === null ? null : Number(k!.prompt_tokens) };
    };
    const folded = async () =>
      (await server.pool.query<{ prompt: string | null }>(
        `SELECT sum(prompt_tokens) AS prompt FROM sarsen.key_usage_hourly WHERE namespace_id = $1 AND api_key_id = $2`,
        [t.namespaceId, t.apiKeyId],
      )).rows[0]!.prompt;

    await append(null);
    await append(null);
    expect(await figures()).to.deep.equal({ events: 2, prompt: null });
    await foldCounters(server.pool);
    expect(await figures()).to.deep.equal({ events: 2, prompt: null });
    expect(await folded()).to.equal(null);

    await append(5);
    await append(null);
    expect(await figures()).to.deep.equal({ events: 4, prompt: 5 });
    await foldCounters(server.pool);
    expect(await figures()).to.deep.equal({ events: 4, prompt: 5 });
    expect(await folded()).to.equal('5');
  });
});
