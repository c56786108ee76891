// Shared pieces of the recovery tests under load: an open-loop load of POST /requests at a
// fixed rate, a provider whose every answer takes about a second (so a kill finds work in
// flight), and the kill → new attempt figures.
import type pg from 'pg';
import { chatFrames, chatCompletionBody, type FakeProvider } from '../support/fake-provider.ts';
import type { Tenant } from '../support/tenant.ts';
import { rawRequest, json } from '../support/http.ts';
import type { Answers, Submitted } from '../support/chaos.ts';

/** Answers every call by its marker after about `ms` (a stream: frames 50 ms apart), recording each answer. */
export function slowRecordingProvider(provider: FakeProvider, ms = 1000): Answers {
  const answers: Answers = new Map();
  let call = 0;
  provider.rule((entry) => {
    const marker = entry.json?.messages?.[0]?.content as string | undefined;
    if (!marker) return undefined;
    const n = ++call;
    const list = answers.get(marker) ?? [];
    answers.set(marker, list);
    if (entry.json.stream) {
      const frames = chatFrames(Array.from({ length: Math.max(1, Math.round(ms / 50)) }, (_, i) => `${marker}/${n}/${i} `), { id: `chatcmpl-${n}` });
      list.push(frames.join(''));
      return { kind: 'sse', frames, frameDelayMs: 50 };
    }
    const body = JSON.stringify(chatCompletionBody(`${marker}/${n}`, { id: `chatcmpl-${n}` }));
    list.push(body);
    return { kind: 'json', body, delayMs: ms };
  });
  return answers;
}

export type Load = { accepted: Submitted[]; refused: () => number; stop(): Promise<void> };

/** Submits `perSecond` distinct requests a second (half of them streams) without waiting for answers, until stopped. */
export function startLoad(t: Tenant, perSecond: number, prefix: string): Load {
  const accepted: Submitted[] = [];
  const inFlight = new Set<Promise<void>>();
  let refused = 0;
  let i = 0;
  const submit = () => {
    const n = i++;
    const marker = `${prefix}-${n}`;
    const stream = n % 2 === 0;
    const p = rawRequest(`${t.base}/requests`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
      body: JSON.stringify({ model: 'gpt-test', stream, messages: [{ role: 'user', content: marker }] }),
    }).then(
      (res) => {
        if (res.status === 202) accepted.push({ id: json(res).request_id, marker, stream });
        else refused++;
      },
      () => void refused++,
    );
    inFlight.add(p);
    void p.finally(() => inFlight.delete(p));
  };
  // Open loop: the rate holds however slowly answers come.
  const started = Date.now();
  const timer = setInterval(() => {
    const due = Math.floor(((Date.now() - started) * perSecond) / 1000);
    while (i < due) submit();
  }, 10);
  return {
    accepted,
    refused: () => refused,
    async stop() {
      clearInterval(timer);
      await Promise.all([...inFlight]);
    },
  };
}

/** What one executor held when it was killed. */
export type Kill = { owner: string; at: number; held: { id: string; attempt: number }[] };

/** The attempts `owner` holds now. */
export async function heldBy(pool: pg.Pool, owner: string): Promise<{ id: string; attempt: number }[]> {
  const { rows } = await pool.query<{ id: string; attempt: number }>(
    `SELECT id, attempts AS attempt FROM sarsen.requests WHERE status = 'running' AND lease_owner = $1`,
    [owner],
  );
  return rows;
}

/** Resolves once each held request has gone past the killed attempt (a new attempt was claimed, or it ended). */
export async function movedOn(pool: pg.Pool, kill: Kill, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const ids = kill.held.map((h) => h.id);
  for (;;) {
    const { rows } = await pool.query<{ id: string; attempts: number; status: string }>(
      `SELECT id, attempts, status FROM sarsen.requests WHERE id = ANY($1::text[])`,
      [ids],
    );
    const at = new Map(kill.held.map((h) => [h.id, h.attempt]));
    const waiting = rows.filter((r) => r.status === 'pending' || (r.status === 'running' && r.attempts <= at.get(r.id)!));
    if (waiting.length === 0) return;
    if (Date.now() > deadline) throw new Error(`${waiting.length} of ${ids.length} requests ${kill.owner} held were not taken up again`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * Per killed attempt, in ms: `detected` kill → the re-dispatch (the dead attempt's log entry
 * ends), `claim` kill → the next attempt's claim, `call` kill → its provider call.
 */
export type RecoveryFigures = { victims: number; detected: number[]; claim: number[]; call: number[] };

/**
 * For every attempt a kill ended (its log entry says `worker_died`), the time from the kill to
 * the next attempt's claim and to its provider call. Checks that each such attempt was
 * recovered exactly once: one log entry for it, followed by exactly one next attempt.
 */
export async function recoveryFigures(pool: pg.Pool, provider: FakeProvider, kills: Kill[], markers: Map<string, string>): Promise<RecoveryFigures> {
  const ids = [...new Set(kills.flatMap((k) => k.held.map((h) => h.id)))];
  const { rows } = await pool.query<{ id: string; attempt_log: { attempt: number; outcome: string; started_at: string; ended_at: string }[] }>(
    `SELECT id, attempt_log FROM sarsen.requests WHERE id = ANY($1::text[])`,
    [ids],
  );
  const logs = new Map(rows.map((r) => [r.id, r.attempt_log]));
  const figures: RecoveryFigures = { victims: 0, detected: [], claim: [], call: [] };
  for (const k of kills) {
    for (const h of k.held) {
      const log = logs.get(h.id)!;
      const entries = log.filter((e) => e.attempt === h.attempt);
      if (entries.length !== 1) throw new Error(`${h.id} attempt ${h.attempt}: ${entries.length} log entries`);
      if (entries[0]!.outcome !== 'worker_died') continue; // it ended before the kill
      figures.victims++;
      figures.detected.push(Date.parse(entries[0]!.ended_at) - k.at);
      const next = log.filter((e) => e.attempt === h.attempt + 1);
      if (next.length !== 1) throw new Error(`${h.id}: attempt ${h.attempt} died, ${next.length} log entries for attempt ${h.attempt + 1}`);
      figures.claim.push(Date.parse(next[0]!.started_at) - k.at);
      const marker = markers.get(h.id)!;
      const call = provider.journal.find((e) => e.json?.messages?.[0]?.content === marker && e.receivedAt >= Date.parse(next[0]!.started_at) - 5);
      if (call) figures.call.push(call.receivedAt - k.at);
    }
  }
  return figures;
}

export function percentile(values: number[], p: number): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

export function describeFigures(label: string, f: RecoveryFigures): string {
  const ms = (v: number) => `${Math.round(v)} ms`;
  const p = (v: number[]) => `p50 ${ms(percentile(v, 50))}, p95 ${ms(percentile(v, 95))}`;
  return `${label}: ${f.victims} attempts killed; kill → re-dispatched ${p(f.detected)}; → new attempt claimed ${p(f.claim)}, max ${ms(Math.max(...f.claim))}; → its provider call ${p(f.call)} (${f.call.length} calls)`;
}
