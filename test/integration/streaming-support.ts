// Helpers shared by the streaming suites: an HTTP reader that keeps every byte of an SSE answer
// with its arrival time, and the byte transforms the replay rules are stated in.
import http from 'node:http';
import type { Tenant } from '../support/tenant.ts';
import { testPool } from '../support/db.ts';
import type { TestDatabase } from '../support/db.ts';

export type Arrival = { at: number; bytes: Buffer };

export type StreamReader = {
  /** Resolves once the status line and headers arrived. */
  head: Promise<{ status: number; headers: http.IncomingHttpHeaders }>;
  arrivals: Arrival[];
  bytes(): Buffer;
  text(): string;
  /** Resolves when the answer ends (`complete` false when the connection was cut). */
  done: Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Buffer; complete: boolean }>;
  /** Resolves once `pred` holds for the bytes received so far. */
  waitFor(pred: (text: string) => boolean, timeoutMs?: number): Promise<void>;
  close(): void;
};

/** One request on its own connection, read incrementally. */
export function openStream(
  url: string,
  opts: { method?: string; headers?: Record<string, string>; body?: string } = {},
): StreamReader {
  const arrivals: Arrival[] = [];
  const listeners = new Set<() => void>();
  const notify = () => {
    for (const l of [...listeners]) l();
  };
  let ended = false;
  let resolveHead!: (h: { status: number; headers: http.IncomingHttpHeaders }) => void;
  const head = new Promise<{ status: number; headers: http.IncomingHttpHeaders }>((r) => (resolveHead = r));
  let req!: http.ClientRequest;
  const done = new Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Buffer; complete: boolean }>((resolve, reject) => {
    req = http.request(url, { method: opts.method ?? 'GET', headers: opts.headers, agent: false }, (res) => {
      resolveHead({ status: res.statusCode!, headers: res.headers });
      res.on('data', (c: Buffer) => {
        arrivals.push({ at: performance.now(), bytes: c });
        notify();
      });
      res.on('error', () => undefined); // a cut connection shows as complete: false
      res.on('close', () => {
        ended = true;
        notify();
        resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(arrivals.map((a) => a.bytes)), complete: res.complete });
      });
    });
    req.on('error', (err) => {
      ended = true;
      notify();
      reject(err);
    });
    req.end(opts.body);
  });
  done.catch(() => undefined);
  const bytes = () => Buffer.concat(arrivals.map((a) => a.bytes));
  return {
    head,
    arrivals,
    bytes,
    text: () => bytes().toString('latin1'),
    done,
    waitFor(pred, timeoutMs = 15_000) {
      return new Promise<void>((resolve, reject) => {
        const check = () => {
          if (pred(bytes().toString('latin1'))) return finish(resolve);
          if (ended) return finish(() => reject(new Error(`stream ended before the condition held; got:\n${bytes().toString('latin1')}`)));
        };
        const timer = setTimeout(() => finish(() => reject(new Error(`condition not met in ${timeoutMs} ms; got:\n${bytes().toString('latin1')}`))), timeoutMs);
        const finish = (fn: () => void) => {
          clearTimeout(timer);
          listeners.delete(check);
          fn();
        };
        listeners.add(check);
        check();
      });
    },
    close: () => req.destroy(),
  };
}

/** POST a JSON body to a service route of the tenant, read as a stream. */
export function postStream(t: Tenant, path: string, body: unknown, headers: Record<string, string> = {}): StreamReader {
  return openStream(`${t.base}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key, ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
}

/** GET /requests/{id} as SSE, optionally resuming after `lastEventId`. */
export function replayStream(t: Tenant, id: string, lastEventId?: string | number): StreamReader {
  const headers: Record<string, string> = { accept: 'text/event-stream', 'x-sarsen-key': t.key };
  if (lastEventId !== undefined) headers['last-event-id'] = String(lastEventId);
  return openStream(`${t.base}/requests/${id}`, { headers });
}

/**
 * Removes the `id: <seq>` lines a replay writes in front of each frame. Works on bytes (latin1
 * round-trips every byte); a line starts after `\n` or `\r`, as SSE line endings do.
 */
export function stripIds(replayed: Buffer | string): Buffer {
  const s = Buffer.isBuffer(replayed) ? replayed.toString('latin1') : replayed;
  return Buffer.from(s.replace(/(^|(?<=[\n\r]))id: \d+\n/g, ''), 'latin1');
}

/** What a replay of `frames` (numbered from `firstSeq`) must be, byte for byte. */
export function withIds(frames: readonly (string | Buffer)[], firstSeq = 1): Buffer {
  return Buffer.concat(frames.map((f, i) => Buffer.concat([Buffer.from(`id: ${firstSeq + i}\n`), Buffer.isBuffer(f) ? f : Buffer.from(f)])));
}

export const bytesOf = (frames: readonly (string | Buffer)[]): Buffer => Buffer.concat(frames.map((f) => (Buffer.isBuffer(f) ? f : Buffer.from(f))));

/** Parses `event: failed` (the last event of a stream) into its JSON data. */
export function failedEventData(text: string): unknown {
  const m = /event: failed\n((?:data: .*\n)+)\n$/.exec(text);
  if (!m) throw new Error(`no trailing event: failed in:\n${text}`);
  return JSON.parse(m[1]!.split('\n').filter(Boolean).map((l) => l.slice('data: '.length)).join('\n'));
}

/** One-off queries against a suite's database. */
export async function query<T = Record<string, unknown>>(db: TestDatabase, sql: string, params: unknown[] = []): Promise<T[]> {
  const pool = testPool(db.conn, 1);
  try {
    return (await pool.query(sql, params)).rows as T[];
  } finally {
    await pool.end();
  }
}

/** SQL of the newest stored frame's sequence number of request $1 (0 before any), named `stored_seq`. */
export const STORED_SEQ = `(SELECT coalesce(max(last_seq), 0) FROM sarsen.chunks WHERE request_id = $1) AS stored_seq`;

/** The id of the request whose stored body contains `marker` (synchronous routes do not return ids). */
export async function requestIdByMarker(db: TestDatabase, marker: string): Promise<string> {
  const rows = await query<{ id: string }>(
    db,
    `SELECT q.id FROM sarsen.requests q JOIN sarsen.request_bodies b ON b.request_id = q.id WHERE b.body LIKE $1 ORDER BY q.id DESC`,
    [`%${marker}%`],
  );
  if (rows.length !== 1) throw new Error(`expected one request with marker ${marker}, found ${rows.length}`);
  return rows[0]!.id;
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A promise a test settles: hand `until` to the fake provider (waitBefore, after) and `open()` it when it is time. */
export function gate(): { until: Promise<void>; open(): void } {
  let open!: () => void;
  const until = new Promise<void>((r) => (open = r));
  return { until, open };
}
