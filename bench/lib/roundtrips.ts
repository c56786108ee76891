// Making sense of the round trips the counting proxy saw: how many per request, by statement,
// how many transactions, and a per-request timeline of the request lifecycle (submission
// commit, executor claim, finish commit, the waiter's reads) followed by request id.
import type { RoundTrip } from './pg-proxy.ts';
import { summarise, type Summary } from './stats.ts';

/** A short, stable label for a statement: its first words, whitespace collapsed. */
export function statementLabel(text: string): string {
  const t = text.replace(/\s+/g, ' ').trim();
  if (/_private_jobs/.test(t) && /for update skip locked/i.test(t)) return 'graphile-worker: get job (lock next job)';
  if (/^delete from "?graphile_worker"?\._private_jobs/i.test(t) || /^with j as \( delete from/i.test(t)) return 'graphile-worker: complete job (delete)';
  return t.length > 90 ? `${t.slice(0, 90)}…` : t;
}

export type Counted = { label: string; count: number; perRequest: number; meanMs: number };

export type RoundTripReport = {
  roundTrips: number;
  transactions: number;
  byStatement: Counted[];
};

export function countRoundTrips(rts: readonly RoundTrip[], requests: number): RoundTripReport {
  const m = new Map<string, { count: number; ms: number }>();
  let transactions = 0;
  for (const rt of rts) {
    if (rt.status === 'I') transactions++;
    const label = statementLabel(rt.text);
    const e = m.get(label) ?? { count: 0, ms: 0 };
    e.count++;
    e.ms += rt.doneAt - rt.sentAt;
    m.set(label, e);
  }
  const byStatement = [...m]
    .map(([label, e]) => ({ label, count: e.count, perRequest: e.count / requests, meanMs: e.ms / e.count }))
    .sort((a, b) => b.count - a.count);
  return { roundTrips: rts.length, transactions, byStatement };
}

type Timeline = {
  txStart?: number;
  submitCommit?: number;
  claimSent?: number;
  claimDone?: number;
  finishTxStart?: number;
  finishCommit?: number;
  statusReads: { sentAt: number; doneAt: number }[];
  recordDone?: number;
};

export type Stages = Record<string, Summary>;

/**
 * Follows each request id through the round trips: a connection's transaction starts with the
 * first round trip after it was idle; the submission is the transaction that inserted the
 * request row, the finish the one that set it succeeded.
 */
export function requestStages(rts: readonly RoundTrip[]): { stages: Stages; followed: number } {
  const byId = new Map<string, Timeline>();
  const get = (id: string) => {
    let t = byId.get(id);
    if (!t) byId.set(id, (t = { statusReads: [] }));
    return t;
  };
  const conn = new Map<number, { txStart: number | null; submit: string | null; finish: string | null }>();
  for (const rt of rts) {
    let c = conn.get(rt.conn);
    if (!c) conn.set(rt.conn, (c = { txStart: null, submit: null, finish: null }));
    c.txStart ??= rt.sentAt;
    const id = rt.params[0];
    if (id && id.startsWith('req_')) {
      if (/INSERT INTO sarsen\.requests /.test(rt.text)) {
        c.submit = id;
        get(id).txStart = c.txStart;
      } else if (/WITH claimed AS/.test(rt.text)) {
        Object.assign(get(id), { claimSent: rt.sentAt, claimDone: rt.doneAt });
      } else if (/SET status = 'succeeded'/.test(rt.text)) {
        c.finish = id;
        get(id).finishTxStart = c.txStart;
      } else if (/^SELECT status FROM sarsen\.requests WHERE id/.test(rt.text.trim())) {
        get(id).statusReads.push({ sentAt: rt.sentAt, doneAt: rt.doneAt });
      } else if (/LEFT JOIN sarsen\.responses/.test(rt.text)) {
        get(id).recordDone = rt.doneAt;
      }
    }
    if (rt.status === 'I') {
      if (c.submit) get(c.submit).submitCommit = rt.doneAt;
      if (c.finish) get(c.finish).finishCommit = rt.doneAt;
      c.txStart = null;
      c.submit = null;
      c.finish = null;
    }
  }
  const series: Record<string, number[]> = {
    'submission transaction (first statement sent → COMMIT answered)': [],
    'submission COMMIT → executor claim sent (graphile-worker pickup)': [],
    'claim round trip': [],
    'claim answered → finish transaction starts (backend read + provider call)': [],
    'finish transaction (BEGIN → COMMIT answered)': [],
    'finish COMMIT → waiter status read sent (wake-up)': [],
    'finish COMMIT → record read answered': [],
    'submission start → record read answered (database view of the request)': [],
  };
  const keys = Object.keys(series);
  let followed = 0;
  for (const t of byId.values()) {
    if (t.txStart === undefined || t.submitCommit === undefined || t.claimSent === undefined || t.finishCommit === undefined) continue;
    if (t.claimDone === undefined || t.finishTxStart === undefined || t.recordDone === undefined) continue;
    followed++;
    const wake = t.statusReads.find((r) => r.sentAt >= t.finishCommit!);
    const values = [
      t.submitCommit - t.txStart,
      t.claimSent - t.submitCommit,
      t.claimDone - t.claimSent,
      t.finishTxStart - t.claimDone,
      t.finishCommit - t.finishTxStart,
      wake ? wake.sentAt - t.finishCommit : NaN,
      t.recordDone - t.finishCommit,
      t.recordDone - t.txStart,
    ];
    values.forEach((v, i) => {
      if (Number.isFinite(v)) series[keys[i]!]!.push(v);
    });
  }
  const stages: Stages = {};
  for (const k of keys) stages[k] = summarise(series[k]!);
  return { stages, followed };
}
