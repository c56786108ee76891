// /metrics after a mixed run: every family docs/operations.md documents, with values that follow the
// traffic this test drives (read as differences, since the registry is the process's), labels
// that never carry an id, a key or a model; the optional bearer token; the access log.
import { expect } from 'chai';
import fs from 'node:fs';
import { startTestServer, testSecrets, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json, until } from '../support/http.ts';
import { addLogSink } from '../../src/log.ts';
import { registry } from '../../src/metrics/metrics.ts';
import { testPool } from '../support/db.ts';
import { storeSetting } from '../../src/db/settings.ts';

type Sample = Map<string, number>; // `name{label="v",...}` -> value

function parse(text: string): Sample {
  const out: Sample = new Map();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

/** The sum of a family's samples whose labels include every pair in `labels`. */
function total(s: Sample, name: string, labels: Record<string, string> = {}): number {
  let sum = 0;
  for (const [key, value] of s) {
    const brace = key.indexOf('{');
    if ((brace < 0 ? key : key.slice(0, brace)) !== name) continue;
    if (Object.entries(labels).every(([k, v]) => key.includes(`${k}="${v}"`))) sum += value;
  }
  return sum;
}

describe('metrics', function () {
  this.timeout(60_000);
  let server: TestServer;
  let provider: FakeProvider;
  let t: Tenant;
  const scrape = async () => {
    const res = await rawRequest(`${server.url}/metrics`);
    expect(res.status).to.equal(200);
    expect(res.headers['content-type']).to.match(/^text\/plain/);
    return res.body.toString('utf8');
  };
  const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
    rawRequest(`${t.base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key, ...headers }, body: JSON.stringify(body) });
  const chat = (content: string, extra: object = {}) => ({ model: 'gpt-metrics', messages: [{ role: 'user', content }], ...extra });

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer({ settings: { synchronous_hold_ms: 2500, retry_base_ms: 20, retry_max_ms: 50, sweep_interval_ms: 100 } });
    t = await provision(server, provider);
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });

  it('shows every family after a mixed run, with values that follow the traffic', async () => {
    const lines: string[] = [];
    const removeSink = addLogSink((l) => lines.push(l));
    try {
      const before = parse(await scrape());

      expect((await post('/chat/completions', chat('one'))).status).to.equal(200); // new
      expect((await post('/chat/completions', chat('one'))).status).to.equal(200); // attached
      expect((await post('/chat/completions', { model: 'nothing-routes-this', messages: [] })).status).to.equal(404); // refused
      provider.enqueue({ kind: 'refuse', status: 503, body: { error: 'busy' } }, { kind: 'default' });
      expect((await post('/chat/completions', chat('retried'))).status).to.equal(200); // one retry for 503
      provider.enqueue({ kind: 'sse', frames: chatFrames(['a', 'b', 'c']) });
      const streamed = await post('/chat/completions', chat('streamed', { stream: true }));
      expect(streamed.status).to.equal(200);
      // While a stream is open, the gauge counts it.
      provider.enqueue({ kind: 'sse', frames: chatFrames(['d', 'e', 'f', 'g']), frameDelayMs: 250 });
      const open = post('/chat/completions', chat('streamed slowly', { stream: true }));
      await until(async () => (total(parse(await scrape()), 'sarsen_streams', { kind: 'live' }) === 1 ? true : undefined), 5000);
      expect((await open).status).to.equal(200);
      provider.enqueue({ kind: 'json', body: { ok: true }, delayMs: 3500 });
      const held = await post('/chat/completions', chat('slow'));
      expect(held.status).to.equal(504);
      // The held request is still running: the gauge read from the database says so.
      const during = parse(await scrape());
      expect(total(during, 'sarsen_requests', { state: 'running' })).to.equal(1);
      const accepted = json(await post('/requests?dialect=chat', chat('fire and forget')));
      await until(async () => {
        const r = json(await rawRequest(`${t.base}/requests/${accepted.request_id}`, { headers: { 'x-sarsen-key': t.key } }));
        return r.status === 'succeeded' ? true : undefined;
      });
      // A replay of the streamed request (its id is in the listing).
      const listing = json(await rawRequest(`${t.base}/requests?limit=200`, { headers: { 'x-sarsen-key': t.key } }));
      const streamedId = listing.data.findLast((r: { streaming: boolean }) => r.streaming).request_id as string;
      const replay = await rawRequest(`${t.base}/requests/${streamedId}`, { headers: { 'x-sarsen-key': t.key, accept: 'text/event-stream' } });
      expect(replay.status).to.equal(200);
      // Let the slow call finish, and a recovery sweep pass.
      await provider.waitUntil(() => provider.journal.filter((e) => e.finishedAt !== undefined).length >= 7, 10_000);
      await new Promise((r) => setTimeout(r, 300));

      const text = await scrape();
      const after = parse(text);
      const delta = (name: string, labels: Record<string, string> = {}) => total(after, name, labels) - total(before, name, labels);

      expect(delta('sarsen_submissions_total', { route: 'chat/completions', dialect: 'chat', outcome: 'new' })).to.equal(5);
      expect(delta('sarsen_submissions_total', { route: 'chat/completions', outcome: 'attached' })).to.equal(1);
      expect(delta('sarsen_submissions_total', { route: 'chat/completions', outcome: 'refused', code: 'not_found' })).to.equal(1);
      expect(delta('sarsen_submissions_total', { route: 'requests', dialect: 'chat', outcome: 'new' })).to.equal(1);
      expect(delta('sarsen_provider_call_duration_seconds_count', { backend_kind: 'chat_compat', status_class: '2xx' })).to.equal(6);
      expect(delta('sarsen_provider_call_duration_seconds_count', { backend_kind: 'chat_compat', status_class: '5xx' })).to.equal(1);
      expect(delta('sarsen_retries_total', { reason: '503' })).to.equal(1);
      expect(delta('sarsen_held_too_long_total', { route: 'chat/completions' })).to.equal(1);
      expect(delta('sarsen_acceptance_to_provider_call_seconds_count')).to.equal(6);
      expect(delta('sarsen_time_to_first_frame_seconds_count')).to.equal(2);
      expect(delta('sarsen_frames_stored_total')).to.be.at.least(3);
      expect(delta('sarsen_chunk_flush_frames_count')).to.be.at.least(1);
      expect(delta('sarsen_chunk_flush_duration_seconds_count')).to.equal(delta('sarsen_chunk_flush_frames_count'));
      expect(delta('sarsen_http_request_duration_seconds_count', { route: '/:tenancy/:namespace/v1/chat/completions', method: 'POST' })).to.equal(7);
      expect(delta('sarsen_sweeps_total', { sweep: 'recovery', result: 'ok' })).to.be.at.least(1);
      // Gauges: nothing is streaming or waiting now; the pool is reported; the database's live states are read.
      expect(after.get('sarsen_streams{kind="live"}')).to.equal(0);
      expect(after.get('sarsen_streams{kind="replay"}')).to.equal(0);
      expect(after.get('sarsen_requests{state="pending"}')).to.equal(0);
      expect(after.get('sarsen_requests{state="running"}')).to.equal(0);
      expect(after.has('sarsen_db_pool_connections{pool="main",state="in_use"}')).to.equal(true);
      expect(total(after, 'sarsen_db_pool_connections', { pool: 'main', state: 'waiting' })).to.equal(0);
      for (const family of ['sarsen_recoveries_total', 'sarsen_hand_backs_total', 'sarsen_bus_reconnects_total', 'sarsen_swept_total', 'sarsen_process_resident_memory_bytes']) {
        expect(text).to.include(`# TYPE ${family}`);
      }
      // Every family the operations page's Metrics table names is exposed (`_*` rows: some family with that prefix).
      const page = fs.readFileSync('docs/operations.md', 'utf8');
      const section = page.slice(page.indexOf('## Metrics'), page.indexOf('\n## ', page.indexOf('## Metrics') + 1));
      const documented = [...section.matchAll(/`(sarsen_[a-z_]+\*?)`/g)].map((m) => m[1]!);
      expect(documented.length).to.be.at.least(19);
      for (const family of documented) expect(text, family).to.include(`# TYPE ${family.replace(/\*$/, '')}`);
      // Bounded labels: no request id, key, model or prompt anywhere in the exposition.
      for (const never of ['req_', t.key, t.apiKeyId, 'gpt-metrics', 'nothing-routes-this', 'fire and forget']) expect(text).to.not.include(never);

      // The access log: one line per request, route pattern and status, the request id of submissions.
      const access = lines.map((l) => JSON.parse(l)).filter((l) => l.message === 'request');
      const submissions = access.filter((l) => l.route === '/:tenancy/:namespace/v1/chat/completions');
      expect(submissions.map((l) => l.status)).to.deep.equal([200, 200, 404, 200, 200, 200, 504]);
      for (const l of submissions.filter((s) => s.status !== 404)) expect(l.request_id).to.match(/^req_/);
      expect(submissions[2].code).to.equal('not_found');
      expect(access.find((l) => l.route === '/:tenancy/:namespace/v1/requests/:id' && l.request_id === streamedId)).to.not.equal(undefined);
      for (const l of access) {
        expect(l.duration_ms).to.be.a('number');
        expect(l.method).to.be.oneOf(['GET', 'POST']);
      }
      expect(lines.join('\n')).to.not.include(t.key).and.not.include('fire and forget');
    } finally {
      removeSink();
    }
  });

  it('counts a hand-back at shutdown and a bus reconnect after the database dropped its connection', async () => {
    const read = async () => parse(await registry.metrics());
    const before = await read();
    const admin = testPool(server.db.conn, 1);
    await storeSetting(admin, 'shutdown_grace_ms', 100).finally(() => admin.end());
    const other = await startTestServer({ db: server.db, secrets: server.secrets });
    try {
      const killer = testPool(other.db.conn, 1);
      try {
        const { rows } = await killer.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'sarsen-bus %' AND datname = $1`, [other.db.name]);
        expect(rows.length).to.be.at.least(1);
      } finally {
        await killer.end();
      }
      await until(async () => (total(await read(), 'sarsen_bus_reconnects_total') - total(before, 'sarsen_bus_reconnects_total') >= 1 ? true : undefined));
      provider.enqueue({ kind: 'hang' });
      const accepted = json(await rawRequest(`${other.url}/${t.tenancy}/${t.namespace}/v1/requests`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key }, body: JSON.stringify(chat('handed back')) }));
      expect(accepted.status, JSON.stringify(accepted)).to.equal('pending');
      await provider.waitUntil(() => provider.journal.some((e) => e.json?.messages?.[0]?.content === 'handed back'));
    } finally {
      await other.close();
    }
    const after = await read();
    expect(total(after, 'sarsen_hand_backs_total', { reason: 'shutdown' }) - total(before, 'sarsen_hand_backs_total', { reason: 'shutdown' })).to.be.at.least(1);
  });

  it('a metrics-token secret makes /metrics need it as a bearer token', async () => {
    const guarded = await startTestServer({ secrets: { ...testSecrets(), metricsToken: 'a-metrics-token-of-enough-length' } });
    try {
      const none = await rawRequest(`${guarded.url}/metrics`);
      expect(none.status).to.equal(401);
      expect(json(none).error.code).to.equal('unauthorised');
      expect((await rawRequest(`${guarded.url}/metrics`, { headers: { authorization: 'Bearer wrong-token' } })).status).to.equal(401);
      const ok = await rawRequest(`${guarded.url}/metrics`, { headers: { authorization: 'Bearer a-metrics-token-of-enough-length' } });
      expect(ok.status).to.equal(200);
      expect(ok.body.toString()).to.include('sarsen_submissions_total');
    } finally {
      await guarded.close();
    }
  });

  it('is served by the executor role too, outside any tenancy', async () => {
    const executor = await startTestServer({ role: 'executor' });
    try {
      const res = await rawRequest(`${executor.url}/metrics`);
      expect(res.status).to.equal(200);
      expect(res.body.toString()).to.include('sarsen_recoveries_total');
    } finally {
      await executor.close();
    }
  });
});
