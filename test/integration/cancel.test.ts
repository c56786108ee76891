// Explicit cancel (issue 18, part 1): POST /requests/{id}/cancel ends a pending request before
// any provider call, aborts a running one wherever its attempt runs (the bus, or the mark its
// executor finds at the next lease renewal), keeps what a stream stored and ends it with
// `event: failed`, and answers a held caller with the `cancelled` envelope.
import { expect } from 'chai';
import { startTestServer, type TestServer } from '../support/server.ts';
import { startFakeProvider, messagesFrames, responsesFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { startDeployment, type Deployment, type SarsenProcess } from '../support/processes.ts';
import { rawRequest, json, until } from '../support/http.ts';
import { testPool } from '../support/db.ts';
import { setPrice } from '../../src/db/accounting.ts';
import { addUser, call, signIn, type Account } from '../support/control-plane.ts';
import { postStream, replayStream, failedEventData, STORED_SEQ, bytesOf, stripIds, gate, requestIdByMarker } from './streaming-support.ts';

const CANCELLED = { error: { code: 'cancelled', message: 'The request was cancelled.' } };

function client(t: Tenant) {
  const headers = { 'content-type': 'application/json', 'x-sarsen-key': t.key };
  return {
    submit: async (body: object, dialect = 'chat') => {
      const res = await rawRequest(`${t.base}/requests?dialect=${dialect}`, { method: 'POST', headers, body: JSON.stringify(body) });
      expect(res.status, res.body.toString()).to.equal(202);
      return json(res).request_id as string;
    },
    cancel: (id: string) => rawRequest(`${t.base}/requests/${id}/cancel`, { method: 'POST', headers }),
    record: async (id: string) => json(await rawRequest(`${t.base}/requests/${id}`, { headers })),
  };
}

const chat = (content: string) => ({ model: 'gpt-test', messages: [{ role: 'user', content }] });

describe('explicit cancel', function () {
  this.timeout(60_000);
  let provider: FakeProvider;
  before(async () => {
    provider = await startFakeProvider();
  });
  after(async () => provider?.close());
  beforeEach(() => provider.reset());

  describe('a pending request (an api-only process: nothing executes)', () => {
    let server: TestServer;
    let t: Tenant;
    before(async () => {
      server = await startTestServer({ role: 'api', settings: { synchronous_hold_ms: 30_000 } });
      t = await provision(server, provider);
    });
    after(async () => server?.close());

    it('ends failed with the cancelled error and no error_status, twice alike, and releases the idempotency claim', async () => {
      const c = client(t);
      const id = await c.submit(chat('pending cancel'));
      const first = await c.cancel(id);
      expect(first.status).to.equal(200);
      expect(json(first)).to.deep.equal({ request_id: id, status: 'failed' });
      const again = await c.cancel(id);
      expect(again.status).to.equal(200);
      expect(json(again)).to.deep.equal(json(first));
      const record = await c.record(id);
      expect(record).to.include({ status: 'failed' });
      expect(record.error).to.deep.equal(CANCELLED);
      expect(record).to.not.have.property('error_status');
      expect(record.attempt_log).to.deep.equal([]); // no attempt ran
      // The same body again is a new request: the claim went with the failure.
      expect(await c.submit(chat('pending cancel'))).to.not.equal(id);
      expect(provider.journal).to.have.length(0);
    });

    it('answers a synchronous caller held on it with 499 and the cancelled envelope', async () => {
      const held = rawRequest(`${t.base}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
        body: JSON.stringify(chat('held then cancelled')),
      });
      const pool = testPool(server.db.conn);
      try {
        // By its body: the previous test leaves a pending request of its own behind.
        const id = await until(async () => {
          const q = await pool.query(
            `SELECT q.id FROM sarsen.requests q JOIN sarsen.request_bodies b ON b.request_id = q.id
              WHERE q.status = 'pending' AND b.body LIKE '%held then cancelled%'`,
          );
          return q.rows[0]?.id as string | undefined;
        });
        expect((await client(t).cancel(id)).status).to.equal(200);
      } finally {
        await pool.end();
      }
      const res = await held;
      expect(res.status).to.equal(499);
      expect(json(res)).to.deep.equal(CANCELLED);
    });

    it('under the console session routes: an admin cancels with the service route\'s answers; a viewer and a cross-site cookie are refused', async () => {
      const c = client(t);
      const tenancyId = (await server.pool.query(`SELECT id FROM sarsen.tenancies WHERE slug = $1`, [t.tenancy])).rows[0].id as string;
      const tenancy = { tenancy: t.tenancy, tenancy_id: tenancyId } as Account;
      const viewer = await signIn(server.url, await addUser(server.pool, tenancy, `viewer@${t.tenancy}.test`, 'viewer'));
      const admin = await addUser(server.pool, tenancy, `admin@${t.tenancy}.test`, 'admin');
      const path = (id: string) => `/${t.tenancy}/v1/namespaces/${t.namespace}/requests/${id}/cancel`;
      const id = await c.submit(chat('cancelled from the console'));

      const refused = await call(server.url, 'POST', path(id), { token: viewer });
      expect(refused.status).to.equal(403);
      expect(refused.body.error.code).to.equal('forbidden');
      const signedIn = await call(server.url, 'POST', `/${t.tenancy}/v1/sessions/cookie`, { body: { email: admin.email, password: admin.password } });
      expect(signedIn.status).to.equal(201);
      const cookie = signedIn.headers.get('set-cookie')!.split(';')[0]!;
      const crossSite = await call(server.url, 'POST', path(id), { headers: { cookie, origin: 'http://evil.example', 'sec-fetch-site': 'cross-site' } });
      expect(crossSite.status).to.equal(403);
      expect(crossSite.body.error.code).to.equal('forbidden');
      expect((await c.record(id)).status).to.equal('pending');

      // The console's own fetch: same origin, the cookie.
      const first = await call(server.url, 'POST', path(id), { headers: { cookie, 'sec-fetch-site': 'same-origin' } });
      expect(first.status).to.equal(200);
      expect(first.body).to.deep.equal({ request_id: id, status: 'failed' });
      expect((await call(server.url, 'POST', path(id), { token: t.adminToken })).body).to.deep.equal(first.body);
      const record = await c.record(id);
      expect(record.status).to.equal('failed');
      expect(record.error).to.deep.equal(CANCELLED);
      expect((await call(server.url, 'POST', path('req_nothing'), { token: t.adminToken })).status).to.equal(404);
      // Another namespace's session route does not reach it.
      const other = await call(server.url, 'POST', `/${t.tenancy}/v1/namespaces/nowhere/requests/${id}/cancel`, { token: t.adminToken });
      expect(other.status).to.equal(404);
      expect(provider.journal).to.have.length(0);
    });

    it('answers 404 for an id of no request here', async () => {
      const res = await client(t).cancel('req_nothing');
      expect(res.status).to.equal(404);
      expect(json(res).error.code).to.equal('not_found');
    });
  });

  describe('a running request (one process)', () => {
    let server: TestServer;
    let t: Tenant;
    before(async () => {
      server = await startTestServer({ settings: { lease_ms: 2000, heartbeat_ms: 200 } });
      t = await provision(server, provider);
    });
    after(async () => server?.close());

    it('while streaming with a replayer attached: the call is aborted, the frames stay, both readers end with event: failed, tokens are kept', async () => {
      const texts = Array.from({ length: 200 }, (_, i) => `w${i} `);
      provider.enqueue({ kind: 'sse', frames: messagesFrames(texts, { inputTokens: 42 }), frameDelayMs: 30 });
      const live = postStream(t, '/messages', { model: 'claude-test', max_tokens: 64, stream: true, messages: [{ role: 'user', content: 'cancel me' }] });
      await provider.waitForRequests(1);
      const pool = testPool(server.db.conn);
      try {
        const id = (await pool.query(`SELECT id FROM sarsen.requests ORDER BY id DESC LIMIT 1`)).rows[0].id as string;
        // One micro-credit a prompt token: the tokens the stored frames report are charged.
        await setPrice(server.pool, 'claude-test', 1_000_000, 1_000_000);
        await until(async () => ((await pool.query(`SELECT ${STORED_SEQ}`, [id])).rows[0].stored_seq >= 5 ? true : undefined));
        const replayer = replayStream(t, id);
        await replayer.waitFor((text) => text.includes('content_block_delta'));
        const res = await client(t).cancel(id);
        expect(res.status).to.equal(202);
        expect(json(res)).to.deep.equal({ request_id: id, status: 'running' });

        const [liveDone, replayDone] = await Promise.all([live.done, replayer.done]);
        for (const done of [liveDone, replayDone]) {
          expect(done.status).to.equal(200);
          expect(failedEventData(done.body.toString())).to.deep.equal(CANCELLED);
        }
        await provider.waitUntil(() => provider.journal[0]!.clientAborted);
        const stored = (await pool.query(`SELECT ${STORED_SEQ}, prompt_tokens, error_status, cost_micros::int AS cost FROM sarsen.requests WHERE id = $1`, [id])).rows[0];
        expect(stored.stored_seq).to.be.above(4).and.below(texts.length);
        expect(stored.prompt_tokens).to.equal(42);
        expect(stored.cost).to.be.at.least(42);
        const ledger = await pool.query(`SELECT amount_micros::int AS amount FROM sarsen.ledger WHERE request_id = $1 AND kind = 'tokens'`, [id]);
        expect(ledger.rows.map((r) => r.amount)).to.deep.equal([stored.cost]);
        expect(stored.error_status).to.equal(null);

        // A later replay shows the same: the frames, then the cancel error.
        const later = await replayStream(t, id).done;
        expect(later.body.toString().startsWith(replayDone.body.toString().slice(0, 200))).to.equal(true);
        expect(failedEventData(later.body.toString())).to.deep.equal(CANCELLED);
        const record = await client(t).record(id);
        expect(record.status).to.equal('failed');
        expect(record.error).to.deep.equal(CANCELLED);
        expect(record.attempt_log.map((e: any) => [e.attempt, e.outcome])).to.deep.equal([[1, 'cancelled']]);
        // Twice: the same answer as for any cancelled request.
        const again = await client(t).cancel(id);
        expect(again.status).to.equal(200);
        expect(json(again)).to.deep.equal({ request_id: id, status: 'failed' });
      } finally {
        await pool.end();
      }
    });

    it('a Responses stream: the call is aborted, the frames stored before the cancel stay, and the stream ends with event: failed', async () => {
      const frames = responsesFrames(['one ', 'two ', 'three']);
      // The provider holds its third delta (frame 6) until the test is done: the cancel lands mid-stream.
      const held = gate();
      provider.enqueue({ kind: 'sse', frames, waitBefore: { 6: held.until } });
      const live = postStream(t, '/responses', { model: 'gpt-test', input: 'cancel this response', stream: true });
      try {
        await provider.waitUntil(() => provider.journal.some((e) => e.path === '/v1/responses'));
        const id = await requestIdByMarker(server.db, 'cancel this response');
        await live.waitFor((text) => text.includes('"delta":"two "'));
        const res = await client(t).cancel(id);
        expect(res.status).to.equal(202);
        expect(json(res)).to.deep.equal({ request_id: id, status: 'running' });

        const done = await live.done;
        expect(done.status).to.equal(200);
        expect(done.body.subarray(0, bytesOf(frames.slice(0, 6)).length).equals(bytesOf(frames.slice(0, 6)))).to.equal(true);
        expect(failedEventData(done.body.toString())).to.deep.equal(CANCELLED);
        const call = provider.journal.find((e) => e.path === '/v1/responses')!;
        await provider.waitUntil(() => call.clientAborted);

        // The record: failed by the cancel, its frames those the provider sent before it.
        const record = await client(t).record(id);
        expect(record).to.include({ status: 'failed', dialect: 'responses', streaming: true });
        expect(record.error).to.deep.equal(CANCELLED);
        expect(record.attempt_log.map((e: any) => [e.attempt, e.outcome])).to.deep.equal([[1, 'cancelled']]);
        const replay = await replayStream(t, id).done;
        const replayed = replay.body.toString('latin1');
        expect(stripIds(replayed.slice(0, replayed.indexOf('event: failed'))).equals(bytesOf(frames.slice(0, 6)))).to.equal(true);
        expect(failedEventData(replay.body.toString())).to.deep.equal(CANCELLED);
      } finally {
        held.open();
      }
    });

    it('a lost notification: the mark alone stops the attempt at its next lease renewal', async () => {
      provider.enqueue({ kind: 'hang' });
      const id = await client(t).submit(chat('mark only'));
      await provider.waitForRequests(1);
      const pool = testPool(server.db.conn);
      try {
        // What the cancel route writes, without its NOTIFY or in-memory event.
        await pool.query(`UPDATE sarsen.requests SET cancel_requested = true WHERE id = $1`, [id]);
      } finally {
        await pool.end();
      }
      const record = await until(async () => {
        const r = await client(t).record(id);
        return r.status === 'failed' ? r : undefined;
      });
      expect(record.error).to.deep.equal(CANCELLED);
      await provider.waitUntil(() => provider.journal[0]!.clientAborted);
    });

    it('a request that already succeeded: 409 conflict naming its status', async () => {
      const id = await client(t).submit(chat('done already'));
      await until(async () => ((await client(t).record(id)).status === 'succeeded' ? true : undefined));
      const res = await client(t).cancel(id);
      expect(res.status).to.equal(409);
      expect(json(res).error.code).to.equal('conflict');
      expect(json(res).error.message).to.include('succeeded');
    });
  });

  describe('across processes (accepted by role api, running in role executor)', () => {
    let d: Deployment;
    let api: SarsenProcess;
    let executor: SarsenProcess;
    let t: Tenant;
    before(async () => {
      d = await startDeployment();
      api = await d.start('api');
      executor = await d.start('executor');
      t = await provision(d.asServer(api), provider);
    });
    after(async () => {
      for (const p of [api, executor]) if (p) await p.kill('SIGTERM');
      await d?.close();
    });

    it('the executor process aborts the provider call at once when the api process cancels', async () => {
      provider.enqueue({ kind: 'hang' });
      const id = await client(t).submit(chat('across processes'));
      await provider.waitForRequests(1);
      const res = await client(t).cancel(id);
      expect(res.status).to.equal(202);
      // The default lease renewal is seconds away: the bus carried it.
      await provider.waitUntil(() => provider.journal[0]!.clientAborted, 5_000);
      const record = await until(async () => {
        const r = await client(t).record(id);
        return r.status === 'failed' ? r : undefined;
      });
      expect(record.error).to.deep.equal(CANCELLED);
      expect(record).to.not.have.property('error_status');
    });
  });
});
