// The request listing's filters (issue 17): status, model, key and creation time range, on the
// service listing (API key) and the console's session listing, which share one handler; paging
// within a filter; and one request's listing row by id (what a link to a request shows).
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json } from '../support/http.ts';
import { call } from '../support/control-plane.ts';
import { createIdGenerator } from '../../src/core/ids.ts';

type Row = { request_id: string; status: string; model: string; api_key_id: string; created_at: string };

describe('listing filters', function () {
  this.timeout(60_000);
  let provider: FakeProvider;
  let server: TestServer;
  let t: Tenant;
  let other: { apiKeyId: string };
  /** The seeded rows, newest first (as the listing orders them). */
  let rows: Row[] = [];
  const T0 = Date.parse('2026-03-01T00:00:00.000Z');
  const HOUR = 3_600_000;

  const byKey = (query: string) => rawRequest(`${t.base}/requests${query ? `?${query}` : ''}`, { headers: { 'x-sarsen-key': t.key } });
  const bySession = (query: string) => call(server.url, 'GET', `/${t.tenancy}/v1/namespaces/${t.namespace}/requests${query ? `?${query}` : ''}`, { token: t.adminToken });
  const ids = (data: Row[]) => data.map((r) => r.request_id);
  const expected = (keep: (r: Row) => boolean) => ids(rows.filter(keep));

  /** Every page of a listing, following next_after with the same query; answers the ids in order. */
  async function all(query: string, limit: number): Promise<string[]> {
    const out: string[] = [];
    let after: string | null = null;
    do {
      const res = await byKey(`${query}&limit=${limit}${after ? `&after=${encodeURIComponent(after)}` : ''}`);
      expect(res.status, `${query}: ${res.body}`).to.equal(200);
      const body = json(res);
      expect(body.data.length).to.be.at.most(limit);
      out.push(...ids(body.data));
      after = body.next_after;
    } while (after);
    return out;
  }

  before(async () => {
    provider = await startFakeProvider();
    server = await startTestServer();
    t = await provision(server, provider);
    other = await t.newKey(['use']);
    // 60 rows, one an hour from T0, ids made at their creation instant as the submission path
    // makes them; statuses, models and keys in cycles of different lengths so filters cross.
    let now = T0;
    const next = createIdGenerator(() => now);
    const seeded = Array.from({ length: 60 }, (_, i) => {
      now = T0 + i * HOUR;
      return {
        request_id: next('req'),
        status: ['succeeded', 'succeeded', 'failed', 'running'][i % 4]!,
        model: ['gpt-a', 'gpt-b', 'gpt-c'][i % 3]!,
        api_key_id: i % 5 === 0 ? other.apiKeyId : t.apiKeyId,
        created_at: new Date(now).toISOString(),
      };
    });
    await server.pool.query(
      `INSERT INTO sarsen.requests (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model, status, created_at)
       SELECT s.id, n.tenancy_id, n.id, s.key, $2, 'chat', false, s.model, s.model, s.status, s.created_at
         FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::timestamptz[]) AS s(id, key, model, status, created_at), sarsen.namespaces n
        WHERE n.id = $1`,
      [t.namespaceId, t.backends.chat, ...(['request_id', 'api_key_id', 'model', 'status', 'created_at'] as const).map((f) => seeded.map((r) => r[f]))],
    );
    rows = seeded.reverse();
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });

  const cases: [string, (r: Row) => boolean][] = [
    ['status=failed', (r) => r.status === 'failed'],
    ['status=running', (r) => r.status === 'running'],
    ['status=pending', () => false],
    ['model=gpt-b', (r) => r.model === 'gpt-b'],
    ['model=gpt-none', () => false],
    ['created_since=2026-03-02T00:00:00Z', (r) => r.created_at >= '2026-03-02T00:00:00.000Z'],
    ['created_before=2026-03-01T10:00:00.000Z', (r) => r.created_at < '2026-03-01T10:00:00.000Z'],
    [`created_since=${T0 + 5 * HOUR}&created_before=${T0 + 9 * HOUR}`, (r) => r.created_at >= new Date(T0 + 5 * HOUR).toISOString() && r.created_at < new Date(T0 + 9 * HOUR).toISOString()],
    ['status=succeeded&model=gpt-a&created_since=2026-03-01T12:00:00%2B02:00', (r) => r.status === 'succeeded' && r.model === 'gpt-a' && r.created_at >= '2026-03-01T10:00:00.000Z'],
  ];

  for (const [query, keep] of cases) {
    it(`${query}: the matching rows newest first, the same by key and by session`, async () => {
      const res = json(await byKey(`${query}&limit=200`));
      expect(ids(res.data)).to.deep.equal(expected(keep));
      expect(res.next_after).to.equal(null);
      const session = await bySession(`${query}&limit=200`);
      expect(session.status).to.equal(200);
      expect(session.body).to.deep.equal(res);
    });
  }

  it('api_key_id: the rows of that key only', async () => {
    const mine = json(await byKey(`api_key_id=${other.apiKeyId}&limit=200`));
    expect(ids(mine.data)).to.deep.equal(expected((r) => r.api_key_id === other.apiKeyId)).and.have.length(12);
    expect(mine.data.every((r: Row) => r.api_key_id === other.apiKeyId)).to.equal(true);
    expect((await bySession(`api_key_id=${other.apiKeyId}&limit=200`)).body).to.deep.equal(mine);
  });

  it('pages through a filter: each cursor continues within the same filter, nothing skipped or repeated', async () => {
    const query = `api_key_id=${t.apiKeyId}&status=succeeded`;
    const want = expected((r) => r.api_key_id === t.apiKeyId && r.status === 'succeeded');
    expect(want.length).to.be.greaterThan(10);
    for (const limit of [1, 3, 7, want.length, 200]) expect(await all(query, limit), `limit ${limit}`).to.deep.equal(want);
    expect(await all(`created_since=${T0 + 20 * HOUR}&created_before=${T0 + 40 * HOUR}`, 6)).to.deep.equal(
      expected((r) => Date.parse(r.created_at) >= T0 + 20 * HOUR && Date.parse(r.created_at) < T0 + 40 * HOUR),
    );
  });

  it('a cursor is refused (400) with other filters than those it came with, and an unfiltered one with a filter', async () => {
    const filtered = json(await byKey('model=gpt-a&limit=2')).next_after;
    const plain = json(await byKey('limit=2')).next_after;
    for (const q of [`model=gpt-b&after=${encodeURIComponent(filtered)}`, `after=${encodeURIComponent(filtered)}`, `model=gpt-a&status=failed&after=${encodeURIComponent(filtered)}`, `model=gpt-a&after=${encodeURIComponent(plain)}`]) {
      const res = await byKey(q);
      expect(res.status, q).to.equal(400);
      expect(json(res).error.code).to.equal('bad_request');
    }
    expect((await byKey(`model=gpt-a&after=${encodeURIComponent(filtered)}`)).status).to.equal(200);
    expect((await bySession(`model=gpt-a&after=${encodeURIComponent(filtered)}`)).status).to.equal(200);
  });

  it('refuses malformed filters with 400 bad_request, by key and by session', async () => {
    const bad = [
      'status=done', 'status=', 'status=failed&status=running', 'model=', `model=${'m'.repeat(513)}`, 'model=a%00b', 'api_key_id=ci',
      'api_key_id=req_01HZZZZZZZZZZZZZZZZZZZZZZZ', 'created_since=yesterday', 'created_since=2026-03-01', 'created_since=2026-03-01T00:00:00',
      'created_before=-5', 'created_before=2026-13-01T00:00:00Z', 'created_since=1.5',
    ];
    for (const q of bad) {
      const res = await byKey(q);
      expect(res.status, q).to.equal(400);
      expect(json(res).error, q).to.include({ code: 'bad_request' });
      const session = await bySession(q);
      expect(session.status, q).to.equal(400);
      expect(session.body.error.code).to.equal('bad_request');
    }
  });

  it('GET /requests/{id}/summary answers the listing row, also once swept; unknown or another namespace is 404', async () => {
    const oldest = rows[rows.length - 1]!.request_id;
    const row = json(await byKey('limit=200')).data.find((r: Row) => r.request_id === oldest);
    const summary = await rawRequest(`${t.base}/requests/${oldest}/summary`, { headers: { 'x-sarsen-key': t.key } });
    expect(summary.status).to.equal(200);
    expect(json(summary)).to.deep.equal(row);
    await server.pool.query(`UPDATE sarsen.requests SET expired = true WHERE id = $1`, [oldest]);
    const swept = await call(server.url, 'GET', `/${t.tenancy}/v1/namespaces/${t.namespace}/requests/${oldest}/summary`, { token: t.adminToken });
    expect(swept.status).to.equal(200);
    expect(swept.body).to.deep.equal({ ...row, expired: true });

    const stranger = await provision(server, provider);
    const foreign = await rawRequest(`${stranger.base}/requests/${oldest}/summary`, { headers: { 'x-sarsen-key': stranger.key } });
    expect(foreign.status).to.equal(404);
    expect(json(foreign).error.code).to.equal('not_found');
    const { key } = await t.newKey(['use']);
    expect((await rawRequest(`${t.base}/requests/${oldest}/summary`, { headers: { 'x-sarsen-key': key } })).status).to.equal(403);
  });
});
