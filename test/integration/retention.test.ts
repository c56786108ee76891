// Retention (issue 8): effective horizons applied by the sweep, 410 for swept records,
// storage counters, lapsed claims, the longer horizons, and running requests left alone.
// Age is simulated by moving a record's finish time back, so the real clock need not pass.
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json } from '../support/http.ts';
import { call } from '../support/control-plane.ts';
import { runRetentionSweep } from '../../src/executor/retention.ts';
import { recountStorage } from '../../src/db/accounting.ts';

const HORIZON = 600; // minutes: the deployment's metadata horizon in this suite

describe('retention', function () {
  this.timeout(120_000);
  let provider: FakeProvider;
  let server: TestServer;

  before(async () => {
    provider = await startFakeProvider();
    // The server's own sweepers stay out of the way: the tests run the sweep themselves.
    server = await startTestServer({ settings: { metadata_horizon_minutes: HORIZON, retention_sweep_interval_ms: 86_400_000, shutdown_grace_ms: 200 } });
  });
  after(async () => {
    await server?.close();
    await provider?.close();
  });

  const submit = (t: Tenant, content: string, extra: object = {}) =>
    rawRequest(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content }], ...extra }),
    }).then((r) => json(r).request_id as string);
  const read = (t: Tenant, id: string, accept?: string) =>
    rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key, ...(accept ? { accept } : {}) } });
  const settle = async (ids: string[]) => {
    for (;;) {
      const { rows } = await server.pool.query(`SELECT count(*)::int AS n FROM sarsen.requests WHERE id = ANY($1) AND status IN ('pending','running')`, [ids]);
      if (rows[0].n === 0) return;
      await new Promise((r) => setTimeout(r, 25));
    }
  };
  const age = (ids: string[], minutes: number) =>
    server.pool.query(`UPDATE sarsen.requests SET finished_at = now() - make_interval(mins => $2) WHERE id = ANY($1)`, [ids, minutes]);
  const expired = async (id: string) => (await server.pool.query(`SELECT expired FROM sarsen.requests WHERE id = $1`, [id])).rows[0].expired as boolean;
  const setRetention = async (t: Tenant, namespace: number | null | undefined, tenancy: number | null | undefined) => {
    if (tenancy !== undefined) expect((await call(server.url, 'PATCH', `/${t.tenancy}/v1/tenancy`, { token: t.adminToken, body: { retention_minutes: tenancy } })).status).to.equal(200);
    if (namespace !== undefined) {
      const res = await call(server.url, 'PATCH', `/${t.tenancy}/v1/namespaces/${t.namespace}`, { token: t.adminToken, body: { retention_minutes: namespace } });
      expect(res.status).to.equal(200);
      return res.body.effective_retention_minutes as number;
    }
    return undefined;
  };

  it('applies each combination of namespace and tenancy horizons, clamped to the metadata horizon', async () => {
    // [namespace, tenancy] -> effective minutes (the retention rules)
    const cases: [number | null, number | null, number][] = [
      [null, null, HORIZON], [null, 0, HORIZON], [null, 60, 60],
      [0, null, HORIZON], [0, 0, HORIZON], [0, 60, HORIZON],
      [30, null, 30], [30, 0, 30], [30, 60, 30],
      [5000, null, HORIZON], [null, 5000, HORIZON],
    ];
    for (const [ns, ten, effective] of cases) {
      const t = await provision(server, provider);
      expect(await setRetention(t, ns, ten), `${ns}/${ten}`).to.equal(effective);
      const justInside = await submit(t, 'inside');
      const justOutside = await submit(t, 'outside');
      await settle([justInside, justOutside]);
      await age([justInside], effective - 1);
      await age([justOutside], effective + 1);
      await runRetentionSweep(server);
      expect(await expired(justInside), `${ns}/${ten} inside`).to.equal(false);
      expect(await expired(justOutside), `${ns}/${ten} outside`).to.equal(true);
    }
  });

  it('a swept record answers 410 as JSON and as a stream; a never-seen id stays 404; the listing keeps its metadata', async () => {
    const t = await provision(server, provider);
    await setRetention(t, 10, undefined);
    const plain = await submit(t, 'plain');
    provider.enqueue({ kind: 'sse', frames: chatFrames(['a', 'b'], { usage: true }) });
    const streamed = await submit(t, 'streamed', { stream: true, stream_options: { include_usage: true } });
    await settle([plain, streamed]);
    await age([plain, streamed], 11);
    const swept = await runRetentionSweep(server);
    expect(swept.records).to.be.at.least(2);
    for (const [id, accept] of [[plain, undefined], [streamed, 'text/event-stream'], [streamed, undefined]] as const) {
      const res = await read(t, id, accept);
      expect(res.status).to.equal(410);
      expect(json(res).error.code).to.equal('record_expired');
    }
    expect((await read(t, 'req_01ARZ3NDEKTSV4RRFFQ69G5FAV')).status).to.equal(404);
    const listing = json(await rawRequest(`${t.base}/requests`, { headers: { 'x-sarsen-key': t.key } })).data;
    const row = listing.find((r: { request_id: string }) => r.request_id === streamed);
    expect(row).to.include({ status: 'succeeded', model: 'gpt-test', expired: true, stored_bytes: 0 });
    expect(row.total_tokens).to.be.a('number');
    const left = await server.pool.query(
      `SELECT (SELECT count(*) FROM sarsen.request_bodies WHERE request_id = ANY($1))::int AS bodies,
              (SELECT count(*) FROM sarsen.responses WHERE request_id = ANY($1))::int AS answers,
              (SELECT count(*) FROM sarsen.chunks WHERE request_id = ANY($1))::int AS frames,
              (SELECT count(*) FROM sarsen.ledger WHERE request_id = ANY($1))::int AS ledger`,
      [[plain, streamed]],
    );
    expect(left.rows[0]).to.deep.equal({ bodies: 0, answers: 0, frames: 0, ledger: 2 });
  });

  it('keeps the storage counters equal to a recount, and a swept body can be sent again as a new request', async () => {
    const t = await provision(server, provider);
    await setRetention(t, 10, undefined);
    const keep = await submit(t, 'keep');
    const go = await submit(t, 'go');
    provider.enqueue({ kind: 'sse', frames: chatFrames(['x', 'y', 'z']) });
    const goStream = await submit(t, 'go stream', { stream: true });
    await settle([keep, go, goStream]);
    await age([go, goStream], 20);
    await runRetentionSweep(server);
    const storage = json(await rawRequest(`${t.base}/storage`, { headers: { 'x-sarsen-key': t.key } }));
    expect(storage).to.include(await recountStorage(server.pool, t.namespaceId));
    expect(storage.stored_bytes).to.be.greaterThan(0); // `keep` is still held
    const again = await submit(t, 'go');
    expect(again).to.not.equal(go);
  });

  it('sweeps lapsed idempotency claims whatever the retention, and never a running request', async () => {
    const t = await provision(server, provider);
    await setRetention(t, 0, undefined); // keep everything
    const done = await submit(t, 'lapsing claim');
    await settle([done]);
    const unhang = provider.rule((e) => (e.json?.messages?.[0]?.content === 'still running' ? { kind: 'hang' } : undefined));
    const running = await submit(t, 'still running');
    await provider.waitUntil(() => provider.journal.some((e) => e.json?.messages?.[0]?.content === 'still running'));
    await server.pool.query(`UPDATE sarsen.idempotency_claims SET expires_at = now() - interval '1 second' WHERE request_id = $1`, [done]);
    // A running request whose start is ancient is still not the sweep's.
    await server.pool.query(`UPDATE sarsen.requests SET started_at = now() - interval '1000 days', created_at = now() - interval '1000 days' WHERE id = $1`, [running]);
    const counts = await runRetentionSweep(server);
    expect(counts.claims).to.be.at.least(1);
    const claims = await server.pool.query(`SELECT request_id FROM sarsen.idempotency_claims WHERE request_id = ANY($1)`, [[done, running]]);
    expect(claims.rows.map((r) => r.request_id)).to.deep.equal([running]);
    expect(await expired(done)).to.equal(false);
    const r = await server.pool.query(`SELECT status, expired FROM sarsen.requests WHERE id = $1`, [running]);
    expect(r.rows[0]).to.deep.equal({ status: 'running', expired: false });
    expect((await server.pool.query(`SELECT 1 FROM sarsen.request_bodies WHERE request_id = $1`, [running])).rowCount).to.equal(1);
    unhang();
  });

  it('removes listing metadata and ledger rows past their own, much longer horizons', async () => {
    const t = await provision(server, provider);
    await setRetention(t, 10, undefined);
    const old = await submit(t, 'ancient');
    const recent = await submit(t, 'recent');
    await settle([old, recent]);
    await age([old], 401 * 24 * 60); // past listing_horizon_days (400)
    await server.pool.query(`UPDATE sarsen.ledger SET created_at = now() - interval '2558 days' WHERE request_id = $1`, [old]);
    await age([recent], 20);
    // Provider response ids (background responses) live as long as the row, and go with it.
    await server.pool.query(
      `INSERT INTO sarsen.provider_response_ids (namespace_id, provider_id, request_id, attempt) SELECT namespace_id, 'resp_' || id, id, 1 FROM sarsen.requests WHERE id = ANY($1)`,
      [[old, recent]],
    );
    await runRetentionSweep(server); // sweeps both records' bodies first...
    await runRetentionSweep(server); // ...then the ancient row's metadata
    expect((await server.pool.query(`SELECT id FROM sarsen.requests WHERE id = ANY($1)`, [[old, recent]])).rows.map((r) => r.id)).to.deep.equal([recent]);
    expect((await server.pool.query(`SELECT request_id FROM sarsen.provider_response_ids WHERE request_id = ANY($1)`, [[old, recent]])).rows.map((r) => r.request_id)).to.deep.equal([recent]);
    expect((await server.pool.query(`SELECT count(*)::int AS n FROM sarsen.ledger WHERE request_id = $1`, [old])).rows[0].n).to.equal(0);
    expect((await server.pool.query(`SELECT count(*)::int AS n FROM sarsen.ledger WHERE request_id = $1`, [recent])).rows[0].n).to.equal(1);
    expect((await read(t, old)).status).to.equal(404); // nothing of it is left to be swept
  });
});
