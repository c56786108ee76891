// Shared pieces of the no-loss tests: a provider whose every answer is recorded per request
// (so the final attempt's bytes are known), a mixed load of streaming and non-streaming
// submissions, and the checks that nothing was lost.
import { expect } from 'chai';
import pg from 'pg';
import { chatFrames, chatCompletionBody, type FakeProvider } from './fake-provider.ts';
import type { Tenant } from './tenant.ts';
import { rawRequest, json } from './http.ts';
import { recountStorage } from '../../src/db/accounting.ts';

export type Answers = Map<string, string[]>; // marker -> the answer bytes of each provider call, in order

/**
 * Answers each call by its marker (the user message), streaming or not, and records it. A
 * non-streaming call whose marker `holdUntil` gives a promise for is answered once it settles.
 */
export function recordingProvider(provider: FakeProvider, holdUntil: (marker: string) => Promise<unknown> | undefined = () => undefined): Answers {
  const answers: Answers = new Map();
  let call = 0;
  provider.rule((entry) => {
    const marker = entry.json?.messages?.[0]?.content as string | undefined;
    if (!marker) return undefined;
    const n = ++call;
    const list = answers.get(marker) ?? [];
    answers.set(marker, list);
    if (entry.json.stream) {
      const frames = chatFrames(Array.from({ length: 12 }, (_, i) => `${marker}/${n}/${i} `), { id: `chatcmpl-${n}` });
      list.push(frames.join(''));
      return { kind: 'sse', frames, frameDelayMs: 25 };
    }
    const body = JSON.stringify(chatCompletionBody(`${marker}/${n}`, { id: `chatcmpl-${n}` }));
    list.push(body);
    return { kind: 'json', body, delayMs: 150, after: holdUntil(marker) };
  });
  return answers;
}

export type Submitted = { id: string; marker: string; stream: boolean };

/** Fires `count` distinct submissions through POST /requests, `concurrency` at a time. */
export async function submitMixed(t: Tenant, count: number, concurrency: number, prefix: string, pauseMs = 0): Promise<{ ok: Submitted[]; refused: number }> {
  const ok: Submitted[] = [];
  let refused = 0;
  let next = 0;
  const worker = async () => {
    while (next < count) {
      const i = next++;
      const marker = `${prefix}-${i}`;
      const stream = i % 2 === 0;
      try {
        const res = await rawRequest(`${t.base}/requests`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
          body: JSON.stringify({ model: 'gpt-test', stream, messages: [{ role: 'user', content: marker }] }),
        });
        if (res.status === 202) ok.push({ id: json(res).request_id, marker, stream });
        else refused++;
      } catch {
        refused++;
      }
      if (pauseMs > 0) await new Promise((r) => setTimeout(r, pauseMs));
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return { ok, refused };
}

const stripIds = (s: string) => s.replace(/^id: \d+\n/gm, '');

/**
 * Every accepted request ends succeeded; its stored answer (or replayed stream with the
 * `id:` lines removed) is exactly the provider's answer to its final attempt; and every
 * attempt beyond the first was a recovery (the provider never refuses here).
 */
export async function expectNothingLost(pool: pg.Pool, t: Tenant, submitted: Submitted[], answers: Answers): Promise<{ recoveries: number }> {
  const { rows } = await pool.query<{ id: string; status: string; attempts: number; recoveries: number }>(
    `SELECT id, status, attempts, recoveries FROM sarsen.requests WHERE id = ANY($1::text[])`,
    [submitted.map((s) => s.id)],
  );
  expect(rows).to.have.length(submitted.length);
  let recoveries = 0;
  const byId = new Map(rows.map((r) => [r.id, r]));
  for (const s of submitted) {
    const r = byId.get(s.id)!;
    if (r.status !== 'succeeded') {
      const detail = await pool.query(`SELECT convert_from(body, 'UTF8') AS body FROM sarsen.responses WHERE request_id = $1`, [s.id]);
      expect.fail(`${s.id} (${s.marker}) ${r.status} after ${r.attempts} attempts: ${detail.rows[0]?.body}`);
    }
    expect(r.recoveries, `${s.id} recoveries vs attempts`).to.equal(r.attempts - 1);
    recoveries += r.recoveries;
    const calls = answers.get(s.marker) ?? [];
    const final = calls[calls.length - 1];
    expect(final, `${s.marker} reached the provider`).to.be.a('string');
    if (s.stream) {
      const res = await rawRequest(`${t.base}/requests/${s.id}`, { headers: { 'x-sarsen-key': t.key, accept: 'text/event-stream' } });
      expect(stripIds(res.body.toString('utf8')), s.marker).to.equal(final);
    } else {
      const rec = await rawRequest(`${t.base}/requests/${s.id}`, { headers: { 'x-sarsen-key': t.key } });
      expect(rec.body.toString('utf8'), s.marker).to.include(`"response":${final}}`);
    }
  }
  // Storage counters agree with the rows they count, whatever was discarded on the way.
  const storage = json(await rawRequest(`${t.base}/storage`, { headers: { 'x-sarsen-key': t.key } }));
  expect(storage).to.include(await recountStorage(pool, t.namespaceId));
  return { recoveries };
}

/** Waits until none of the requests is pending or running. */
export async function settled(pool: pg.Pool, ids: string[], timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { rows } = await pool.query(`SELECT count(*)::int AS n FROM sarsen.requests WHERE id = ANY($1::text[]) AND status IN ('pending', 'running')`, [ids]);
    if (rows[0].n === 0) return;
    if (Date.now() > deadline) throw new Error(`${rows[0].n} requests still unsettled`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/**
 * graphile-worker jobs that belong to no live request, once things have had `withinMs` to
 * settle (a job whose completion met an outage is freed and completed by a restarted worker
 * pool): what a recovery must not leave behind for good (a dead worker's locked job, its key
 * taken away by a re-dispatch, would stay for hours).
 */
export async function strayJobs(pool: pg.Pool, withinMs = 10_000): Promise<{ id: string; key: string | null; locked_by: string | null }[]> {
  const deadline = Date.now() + withinMs;
  for (;;) {
    const { rows } = await pool.query(
      `SELECT j.id, j.key, j.locked_by FROM graphile_worker.jobs j
        WHERE NOT EXISTS (SELECT 1 FROM sarsen.requests q WHERE q.id = j.key AND q.status IN ('pending', 'running'))`,
    );
    if (rows.length === 0 || Date.now() > deadline) return rows;
    await new Promise((r) => setTimeout(r, 200));
  }
}
