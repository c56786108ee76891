// Time partitions (issue 28, docs/storage.md): created ahead, dropped whole once every record in
// them is past its namespace's horizon (one statement moves the retired mark and the storage
// counters), records of shorter horizons swept row by row inside partitions that stay, and the
// records of a dropped day answering 410. Records are submitted for real, then given the id
// (and times) of a record made days ago: the id decides the partition.
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { createTestDatabase } from '../support/db.ts';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { rawRequest, json } from '../support/http.ts';
import { call } from '../support/control-plane.ts';
import { runRetentionSweep } from '../../src/executor/retention.ts';
import { recountStorage } from '../../src/db/accounting.ts';
import { createPool } from '../../src/db/pool.ts';
import { ensurePartitions, listPartitions, PAYLOADS, REQUESTS } from '../../src/db/partitions.ts';
import { firstIdAt, idTime } from '../../src/core/ids.ts';
import { floorTo, partitionName } from '../../src/core/partitions.ts';

const DAY = 86_400_000;
const SHORT = 30 * 24 * 60; // minutes: namespace B's horizon; A keeps the metadata horizon (90 days)

describe('time partitions', function () {
  this.timeout(180_000);
  let provider: FakeProvider;
  let server: TestServer;
  let a: Tenant;
  let b: Tenant;

  before(async () => {
    provider = await startFakeProvider();
    // A deployment 100 days into partitions: the migration's first partition (empty here) is
    // gone, and a partition was made ahead each day, as the executors' pass makes them.
    const db = await createTestDatabase({ retention_sweep_interval_ms: 86_400_000, shutdown_grace_ms: 200 });
    const pool = createPool(db.conn, { max: 2 });
    try {
      for (const p of await listPartitions(pool, [...PAYLOADS.tables, ...REQUESTS.tables, 'ledger'])) {
        await pool.query(`ALTER TABLE sarsen.${p.table} DETACH PARTITION sarsen.${p.name}`);
        await pool.query(`DROP TABLE sarsen.${p.name}`);
      }
      for (let t = Date.now() - 100 * DAY; t <= Date.now(); t += DAY) await ensurePartitions(pool, t);
    } finally {
      await pool.end();
    }
    server = await startTestServer({ db, settings: { retention_sweep_interval_ms: 86_400_000 } });
    a = await provision(server, provider);
    b = await provision(server, provider);
    const res = await call(server.url, 'PATCH', `/${b.tenancy}/v1/namespaces/${b.namespace}`, { token: b.adminToken, body: { retention_minutes: SHORT } });
    expect(res.body.effective_retention_minutes).to.equal(SHORT);
  });
  after(async () => {
    await server?.close();
    await server?.db.drop();
    await provider?.close();
  });

  const submit = async (t: Tenant, content: string, stream = false) => {
    if (stream) provider.enqueue({ kind: 'sse', frames: chatFrames(['x', 'y', 'z']) });
    const res = await rawRequest(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', messages: [{ role: 'user', content }], ...(stream ? { stream: true } : {}) }),
    });
    const id = json(res).request_id as string;
    for (;;) {
      const { rows } = await server.pool.query(`SELECT status FROM sarsen.requests WHERE id = $1`, [id]);
      if (rows[0].status === 'succeeded') return id;
      await new Promise((r) => setTimeout(r, 20));
    }
  };
  /** Makes a settled record one made `daysAgo` (its id and every time moved back), finished `finishedDaysAgo`. */
  const backdate = async (id: string, daysAgo: number, finishedDaysAgo = daysAgo) => {
    const moved = firstIdAt('req', idTime(id) - daysAgo * DAY).slice(0, 14) + id.slice(14);
    const c = await server.pool.connect();
    try {
      await c.query('BEGIN');
      await c.query(
        `UPDATE sarsen.requests SET id = $2, created_at = created_at - make_interval(days => $3), started_at = started_at - make_interval(days => $3),
                finished_at = now() - make_interval(days => $4) WHERE id = $1`,
        [id, moved, daysAgo, finishedDaysAgo],
      );
      for (const table of ['request_bodies', 'responses', 'chunks', 'idempotency_claims']) await c.query(`UPDATE sarsen.${table} SET request_id = $2 WHERE request_id = $1`, [id, moved]);
      await c.query(`UPDATE sarsen.ledger SET request_id = $2, created_at = created_at - make_interval(days => $3) WHERE request_id = $1`, [id, moved, daysAgo]);
      await c.query('COMMIT');
    } finally {
      c.release();
    }
    return moved;
  };
  const read = (t: Tenant, id: string, accept?: string) => rawRequest(`${t.base}/requests/${id}`, { headers: { 'x-sarsen-key': t.key, ...(accept ? { accept } : {}) } });
  const storage = async (t: Tenant) => json(await rawRequest(`${t.base}/storage`, { headers: { 'x-sarsen-key': t.key } }));
  const summary = async (t: Tenant, id: string) => json(await rawRequest(`${t.base}/requests/${id}/summary`, { headers: { 'x-sarsen-key': t.key } }));
  const dayPartition = (daysAgo: number) => partitionName('request_bodies', floorTo(Date.now() - daysAgo * DAY, 'day'), 'day');
  const payloadPartitions = async () => new Set((await listPartitions(server.pool, ['request_bodies'])).map((p) => p.name));
  const expectStorageExact = async () => {
    for (const t of [a, b]) expect(await storage(t), t.namespace).to.include(await recountStorage(server.pool, t.namespaceId));
  };

  it('creates partitions ahead: payloads three days, request rows and the ledger into next month', async () => {
    const now = Date.now();
    for (const table of [...PAYLOADS.tables, ...REQUESTS.tables, 'ledger']) {
      const newest = (await listPartitions(server.pool, [table])).pop()!;
      expect(newest.hiMs, table).to.be.at.least(table === 'ledger' || REQUESTS.tables.includes(table) ? now + 31 * DAY : now + 3 * DAY);
    }
    // Provider response ids live as long as their request rows: the same ranges.
    const bounds = async (table: string) => (await listPartitions(server.pool, [table])).map((p) => `${p.lo}..${p.hi}`);
    expect(await bounds('provider_response_ids')).to.deep.equal(await bounds('requests'));
    expect(await ensurePartitions(server.pool)).to.equal(0); // nothing missing: each is made once
    const bodies = (await listPartitions(server.pool, ['request_bodies'])).length;
    await ensurePartitions(server.pool, now + 2 * DAY);
    expect((await listPartitions(server.pool, ['request_bodies'])).length).to.equal(bodies + 2); // two days more
  });

  it('drops a day only once every record in it is past its namespace\'s horizon, and reads its records as swept', async () => {
    // 95 days ago: records of A (90 days) and B (30 days), one of them streamed.
    const a95 = await backdate(await submit(a, 'a95'), 95);
    const s95 = await backdate(await submit(a, 's95', true), 95);
    const b95 = await backdate(await submit(b, 'b95'), 95);
    // 93 days ago: a record of A that finished 89 days ago, inside A's horizon still.
    const late = await backdate(await submit(a, 'late'), 93, 89);
    // 60 days ago: A's record within its horizon, B's past its own.
    const a60 = await backdate(await submit(a, 'a60'), 60);
    const b60 = await backdate(await submit(b, 'b60'), 60);
    await expectStorageExact();
    expect((await read(a, a95)).status).to.equal(200);

    // (A pass drops at most a week: the days before these were empty.)
    const first = await runRetentionSweep(server);
    while ((await runRetentionSweep(server)).partitions > 0);
    const left = await payloadPartitions();
    expect(left.has(dayPartition(95)), '95 days ago').to.equal(false);
    expect(left.has(dayPartition(94)), '94 days ago').to.equal(false);
    expect(left.has(dayPartition(93)), 'the late record holds its day').to.equal(true);
    expect(first.partitions).to.be.at.least(2 * PAYLOADS.tables.length);
    // Dropped: 410 as JSON and as a stream, swept in the listing, with no bytes, never written to.
    for (const [t, id] of [[a, a95], [b, b95]] as const) {
      const res = await read(t, id);
      expect(res.status).to.equal(410);
      expect(json(res).error.code).to.equal('record_expired');
      expect(await summary(t, id)).to.include({ status: 'succeeded', expired: true, stored_bytes: 0 });
    }
    expect((await read(a, s95, 'text/event-stream')).status).to.equal(410);
    expect((await server.pool.query(`SELECT expired FROM sarsen.requests WHERE id = $1`, [a95])).rows[0].expired).to.equal(false);
    // The day that stays: B's record past B's horizon swept row by row, A's readable.
    expect((await read(b, b60)).status).to.equal(410);
    expect((await read(a, a60)).status).to.equal(200);
    expect((await read(a, late)).status).to.equal(200);
    await expectStorageExact();

    // Once the late record passes A's horizon too, its day goes.
    await server.pool.query(`UPDATE sarsen.requests SET finished_at = now() - interval '91 days' WHERE id = $1`, [late]);
    while ((await runRetentionSweep(server)).partitions > 0);
    expect((await payloadPartitions()).has(dayPartition(93))).to.equal(false);
    expect((await payloadPartitions()).has(dayPartition(61))).to.equal(false);
    expect((await payloadPartitions()).has(dayPartition(60))).to.equal(true);
    expect((await read(a, late)).status).to.equal(410);
    await expectStorageExact();
    expect((await rawRequest(`${a.base}/requests`, { headers: { 'x-sarsen-key': a.key } })).status).to.equal(200);
  });

  it('sweeps a shorter horizon row by row inside today\'s partition, which stays', async () => {
    const keep = await submit(a, 'a today');
    const goes = await submit(b, 'b today', true);
    await server.pool.query(`UPDATE sarsen.requests SET finished_at = now() - make_interval(mins => $2) WHERE id = $1`, [goes, SHORT + 1]);
    // A's record is past the overdue mark for nothing: today's partition is not due.
    const counts = await runRetentionSweep(server);
    expect(counts.records).to.equal(1);
    expect((await read(b, goes, 'text/event-stream')).status).to.equal(410);
    expect((await server.pool.query(`SELECT expired FROM sarsen.requests WHERE id = $1`, [goes])).rows[0].expired).to.equal(true);
    expect((await read(a, keep)).status).to.equal(200);
    const left = await payloadPartitions();
    for (const day of [60, 0, -3]) expect(left.has(dayPartition(day)), `${day} days ago`).to.equal(true);
    await expectStorageExact();
  });

  it('finishes a drop a killed pass left halfway (mark moved, bytes taken off, partition still there) without taking its bytes twice', async () => {
    const [oldest] = await listPartitions(server.pool, PAYLOADS.tables);
    const inside = (await server.pool.query(`SELECT id FROM sarsen.requests WHERE id >= $1 AND id < $2 AND NOT expired`, [oldest!.lo ?? '', oldest!.hi])).rows;
    expect(inside).to.have.length.greaterThan(0); // A's record of 60 days ago
    // What the drop's statement commits before the partitions are detached.
    await server.pool.query(
      `WITH gone AS (
         SELECT namespace_id, sum(request_bytes) AS r, sum(response_bytes) AS a, sum(chunk_bytes) AS c FROM sarsen.requests
          WHERE id >= $1 AND id < $2 GROUP BY namespace_id
       ), moved AS (UPDATE sarsen.retired_payloads SET below = $2)
       INSERT INTO sarsen.usage_rollup (namespace_id, shard, request_bytes, response_bytes, chunk_bytes)
       SELECT namespace_id, 0, -r, -a, -c FROM gone
       ON CONFLICT (namespace_id, shard) DO UPDATE SET request_bytes = usage_rollup.request_bytes + EXCLUDED.request_bytes,
         response_bytes = usage_rollup.response_bytes + EXCLUDED.response_bytes, chunk_bytes = usage_rollup.chunk_bytes + EXCLUDED.chunk_bytes`,
      [oldest!.lo ?? '', oldest!.hi],
    );
    await runRetentionSweep(server);
    expect((await payloadPartitions()).has(oldest!.name)).to.equal(false);
    await expectStorageExact();
    for (const r of inside) expect((await read(a, r.id)).status).to.equal(410);
  });

  it('drops request rows and the ledger a month at a time past their own horizons', async () => {
    const [month] = await listPartitions(server.pool, ['requests']);
    const old = (await server.pool.query(`SELECT id, namespace_id FROM sarsen.requests WHERE id >= $1 AND id < $2 LIMIT 1`, [month!.lo ?? '', month!.hi])).rows[0].id as string;
    // A provider response id recorded for it (a background response's) goes with its month.
    await server.pool.query(
      `INSERT INTO sarsen.provider_response_ids (namespace_id, provider_id, request_id, attempt) SELECT namespace_id, 'resp_old', id, 1 FROM sarsen.requests WHERE id = $1`,
      [old],
    );
    expect((await rawRequest(`${a.base}/requests/${old}/summary`, { headers: { 'x-sarsen-key': a.key } })).status).to.be.oneOf([200, 404]);
    const setDays = async (listing: number, ledger: number) => {
      await server.pool.query(`UPDATE sarsen.settings SET value = to_jsonb($1::int) WHERE name = 'listing_horizon_days'`, [listing]);
      await server.pool.query(`UPDATE sarsen.settings SET value = to_jsonb($1::int) WHERE name = 'ledger_horizon_days'`, [ledger]);
      await server.settings.refresh();
    };
    await setDays(1, 1);
    try {
      const counts = await runRetentionSweep(server);
      expect(counts.partitions).to.be.at.least(2);
      const names = new Set((await listPartitions(server.pool, ['requests', 'ledger'])).map((p) => p.name));
      expect(names.has(month!.name)).to.equal(false);
      expect((await server.pool.query(`SELECT count(*)::int AS n FROM sarsen.requests WHERE id = $1`, [old])).rows[0].n).to.equal(0);
      expect((await server.pool.query(`SELECT count(*)::int AS n FROM sarsen.ledger WHERE request_id = $1`, [old])).rows[0].n).to.equal(0);
      expect((await server.pool.query(`SELECT count(*)::int AS n FROM sarsen.provider_response_ids WHERE request_id = $1`, [old])).rows[0].n).to.equal(0);
      expect((await listPartitions(server.pool, ['provider_response_ids'])).map((p) => p.hi)).to.not.include(month!.hi);
      // The current months are still being written: they stay, and so do their records.
      expect(names.has(partitionName('requests', floorTo(Date.now(), 'month'), 'month'))).to.equal(true);
      expect(names.has(partitionName('ledger', floorTo(Date.now(), 'month'), 'month'))).to.equal(true);
      await expectStorageExact();
    } finally {
      await setDays(400, 2557);
    }
  });
});
