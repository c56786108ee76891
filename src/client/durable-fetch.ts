// durableFetch: a `fetch` for the official SDKs that survives the caller's own connection
// breaking (docs/clients.md "Durable fetch"). It depends on nothing but the platform's fetch,
// streams and timers, so this one file runs in Node, Deno, Bun, browsers and edge runtimes, and
// may be copied into an application as it stands.
//
// How it finds a request again, without ever starting a second provider call:
// - every answer of a synchronous route names its request in `x-sarsen-request-id`, and a live
//   stream names its first frame's sequence number in `x-sarsen-first-seq`; once a stream has
//   begun, a break is resumed by id (GET /requests/{id}, Last-Event-ID), at any age;
// - before the answer began there is no id yet: the identical body is sent again with
//   `x-sarsen-attach: only`, which lands on the live execution of that body or answers 404 and
//   starts nothing; this works only inside the idempotency window, counted from the first send.

const SUBMISSION_PATH = /\/(chat\/completions|messages|responses)\/?$/;
const REQUEST_ID = 'x-sarsen-request-id';
const FIRST_SEQ = 'x-sarsen-first-seq';
const ATTACH = 'x-sarsen-attach';
// Sarsen's own comment on a quiet stream: not a stored frame, so not counted.
const KEEP_ALIVE = ': keep-alive\n\n';
const SARSEN_KEY = 'x-sarsen-key';
// Errors that mean the connection never opened, so the body never left.
const NEVER_SENT = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'UND_ERR_CONNECT_TIMEOUT']);

export type DurableFetchOptions = {
  /** The fetch underneath (default: the platform's). */
  fetch?: typeof fetch;
  /** Tries after one break before giving up; the count starts again once a frame or byte arrives. Default 6. */
  retries?: number;
  /** The first wait between tries, doubled each time up to `maxBackoffMs`, with jitter. Default 250. */
  backoffMs?: number;
  maxBackoffMs?: number;
  /** A stream that sends nothing for this long is taken as broken. Sarsen sends a keep-alive every 15 s. Default 45000. */
  stallMs?: number;
  /** Sarsen's idempotency window (10 minutes); a body is re-sent only inside it, less a minute's margin. */
  windowMs?: number;
  /** Told of every resume: what broke and how it was taken up again. */
  onResume?: (info: ResumeInfo) => void;
};

export type ResumeInfo = {
  /** Null until the answer began. */
  requestId: string | null;
  /** `attach`: the body re-sent with `x-sarsen-attach: only`; `replay`: read by id from `afterSeq`; `resend`: the body never left. */
  how: 'attach' | 'replay' | 'resend';
  afterSeq: number | null;
  /** Tries since the break, from 1. */
  attempt: number;
  error: unknown;
};

/** Why durableFetch gave up: `gave_up` (tries exhausted), `window_passed`, `not_found` (nothing live to attach to), `lost` (the record is gone). */
export class DurableFetchError extends Error {
  readonly code: 'gave_up' | 'window_passed' | 'not_found' | 'lost';
  readonly requestId: string | null;
  constructor(code: DurableFetchError['code'], message: string, requestId: string | null, cause?: unknown) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = 'DurableFetchError';
    this.code = code;
    this.requestId = requestId;
  }
}

const WINDOW_MARGIN_MS = 60_000;

type ReadResult = { done: false; value: Uint8Array } | { done: true; value?: Uint8Array };

/** A fetch that makes each submission it sends to Sarsen durable; every other call passes through. */
export function durableFetch(options: DurableFetchOptions = {}): typeof fetch {
  const base = options.fetch ?? ((input: Parameters<typeof fetch>[0], init?: RequestInit) => globalThis.fetch(input, init));
  const o = settingsOf(options);
  const durable = (input: Parameters<typeof fetch>[0], init?: RequestInit): Promise<Response> => {
    const url = typeof input === 'string' ? input : input instanceof URL ? input.href : null;
    const method = (init?.method ?? 'GET').toUpperCase();
    // Only a body it can send again word for word: the SDKs send their JSON as a string.
    if (url === null || method !== 'POST' || typeof init?.body !== 'string' || !SUBMISSION_PATH.test(new URL(url).pathname)) {
      return base(input, init);
    }
    return new Call(base, url, init, o).start();
  };
  return durable as typeof fetch;
}

/**
 * A fetch that answers every submission its SDK sends with the stream of request `requestId`,
 * replayed from its start as the provider sent it (docs/clients.md "Resume by request id"); the
 * body is never sent. For a stream the application let go of: a page reload, a restarted server.
 */
export function replayFetch(requestId: string, options: DurableFetchOptions = {}): typeof fetch {
  const base = options.fetch ?? ((input: Parameters<typeof fetch>[0], init?: RequestInit) => globalThis.fetch(input, init));
  const o = settingsOf(options);
  const replaying = (input: Parameters<typeof fetch>[0], init?: RequestInit): Promise<Response> => {
    const url = typeof input === 'string' ? input : input instanceof URL ? input.href : null;
    if (url === null || !SUBMISSION_PATH.test(new URL(url).pathname)) return base(input, init);
    return new Call(base, url, init ?? {}, o).replay(requestId);
  };
  return replaying as typeof fetch;
}

const settingsOf = (options: DurableFetchOptions): Settings => ({
  retries: options.retries ?? 6,
  backoffMs: options.backoffMs ?? 250,
  maxBackoffMs: options.maxBackoffMs ?? 4000,
  stallMs: options.stallMs ?? 45_000,
  windowMs: options.windowMs ?? 600_000,
  onResume: options.onResume,
});

type Settings = Required<Omit<DurableFetchOptions, 'fetch' | 'onResume'>> & Pick<DurableFetchOptions, 'onResume'>;

class Call {
  private readonly base: (input: string, init: RequestInit) => Promise<Response>;
  private readonly url: string;
  private readonly init: RequestInit;
  private readonly o: Settings;
  private readonly signal: AbortSignal | undefined;
  private sentAt = 0;
  private requestId: string | null = null;

  constructor(base: (input: string, init: RequestInit) => Promise<Response>, url: string, init: RequestInit, o: Settings) {
    this.base = base;
    this.url = url;
    this.init = init;
    this.o = o;
    this.signal = init.signal ?? undefined;
  }

  async start(): Promise<Response> {
    this.sentAt = Date.now();
    const res = await this.firstAnswer();
    this.requestId = res.headers.get(REQUEST_ID);
    // Not Sarsen's answer to an accepted submission (refused at the door, or not Sarsen at all): as it came.
    if (this.requestId === null || res.body === null) return res;
    const streaming = res.ok && /^text\/event-stream/i.test(res.headers.get('content-type') ?? '');
    const firstSeq = Number(res.headers.get(FIRST_SEQ) ?? '1');
    const body = streaming
      ? this.streamBody(new Connection(res, null, this.o.stallMs), false, Number.isSafeInteger(firstSeq) && firstSeq > 0 ? firstSeq : 1)
      : this.wholeBody(res);
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  }

  /** The stream of `requestId` from its start, by id. */
  async replay(requestId: string): Promise<Response> {
    this.requestId = requestId;
    const conn = await this.reopen(0, 0);
    return new Response(this.streamBody(conn, true, 1), { status: 200, headers: conn.res.headers });
  }

  /** The first answer's status and headers, finding the request again by its body if the connection broke before them. */
  private async firstAnswer(): Promise<Response> {
    let mayHaveArrived = false;
    let lastError: unknown;
    for (let attempt = 0; ; attempt++) {
      if (attempt > 0) {
        if (attempt > this.o.retries) throw new DurableFetchError('gave_up', `No answer after ${this.o.retries} tries.`, null, lastError);
        this.o.onResume?.({ requestId: null, how: mayHaveArrived ? 'attach' : 'resend', afterSeq: null, attempt, error: lastError });
        await this.backoff(attempt);
        this.checkWindow(mayHaveArrived, lastError);
      }
      try {
        const res = await this.sendBody(mayHaveArrived);
        if (mayHaveArrived && res.status === 404 && !res.headers.has(REQUEST_ID)) {
          // Nothing live: the first body is not committed yet, never arrived, or its execution
          // failed and released the claim. Only the first is worth another try.
          await res.body?.cancel();
          lastError = new DurableFetchError('not_found', 'Sarsen holds no live execution of this body to attach to.', null);
          continue;
        }
        return res;
      } catch (err) {
        if (this.signal?.aborted) throw err;
        lastError = err;
        if (!neverSent(err)) mayHaveArrived = true;
      }
    }
  }

  private sendBody(attachOnly: boolean, signal = this.signal): Promise<Response> {
    const headers = new Headers(this.init.headers);
    if (attachOnly) headers.set(ATTACH, 'only');
    return this.base(this.url, { ...this.init, headers, signal });
  }

  private checkWindow(bodyMayHaveArrived: boolean, cause: unknown): void {
    if (bodyMayHaveArrived && Date.now() - this.sentAt > this.o.windowMs - WINDOW_MARGIN_MS) {
      throw new DurableFetchError('window_passed', 'The idempotency window has passed: the body cannot be sent again safely.', this.requestId, cause);
    }
  }

  private backoff(attempt: number): Promise<void> {
    const ceiling = Math.min(this.o.maxBackoffMs, this.o.backoffMs * 2 ** (attempt - 1));
    const ms = ceiling / 2 + Math.random() * (ceiling / 2);
    const signal = this.signal;
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      const done = () => {
        signal?.removeEventListener('abort', aborted);
        resolve();
      };
      const timer = setTimeout(done, ms);
      const aborted = () => {
        clearTimeout(timer);
        reject(signal!.reason);
      };
      signal?.addEventListener('abort', aborted, { once: true });
    });
  }

  /** One connection's reads, each bounded by the stall time; `abort` drops the connection. */
  private connection(open: (signal: AbortSignal) => Promise<Response>): Promise<Connection> {
    const own = new AbortController();
    const signal = this.signal ? AbortSignal.any([this.signal, own.signal]) : own.signal;
    return open(signal).then((res) => new Connection(res, own, this.o.stallMs));
  }

  /**
   * A stream's body: whole frames handed on as they complete, counted so that a break resumes
   * by id right after the last one. Sarsen's keep-alives are passed on but not counted.
   */
  private streamBody(first: Connection, replayed: boolean, firstSeq: number): ReadableStream<Uint8Array> {
    let nextSeq = firstSeq;
    let conn: Connection | null = first;
    let replaying = replayed;
    let ended = false;
    const framer = createFramer();
    return new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        for (let tries = 0; ; ) {
          if (conn === null) {
            tries++;
            try {
              conn = await this.reopen(nextSeq - 1, tries);
              replaying = true;
              framer.reset();
            } catch (err) {
              controller.error(err);
              return;
            }
          }
          const read = await this.readOrBreak(conn);
          if (read === 'aborted') return controller.error(this.signal?.reason);
          if (read === 'broke') {
            conn = null;
            continue;
          }
          if (read.done) {
            for (const rest of framer.end()) controller.enqueue(rest);
            controller.close();
            return;
          }
          let sent = false;
          for (const frame of framer.push(read.value)) {
            let out = frame;
            if (replaying) {
              const seq = idLine(frame);
              if (seq !== null) {
                out = frame.subarray(seq.length);
                nextSeq = seq.seq + 1;
              } else if (startsWith(frame, 'event: failed')) ended = true;
            } else if (!isKeepAlive(frame)) {
              nextSeq++;
            }
            controller.enqueue(out);
            sent = true;
            tries = 0;
          }
          if (ended) {
            conn.drop();
            controller.close();
            return;
          }
          if (sent) return;
        }
      },
      cancel: () => {
        conn?.drop();
      },
    });
  }

  private lastBreak: unknown;

  /** One read; a connection that breaks is dropped and its error kept for the give-up message. */
  private async readOrBreak(conn: Connection): Promise<ReadResult | 'broke' | 'aborted'> {
    try {
      return await conn.read();
    } catch (err) {
      conn.drop();
      if (this.signal?.aborted) return 'aborted';
      this.lastBreak = err;
      return 'broke';
    }
  }

  /** The stream again from after `afterSeq`, by id, waiting and retrying as the rules say. */
  private async reopen(afterSeq: number, attempt: number): Promise<Connection> {
    for (; ; attempt++) {
      if (attempt > this.o.retries) throw new DurableFetchError('gave_up', `The stream broke and ${this.o.retries} tries to resume it failed.`, this.requestId, this.lastBreak);
      if (attempt > 0) {
        this.o.onResume?.({ requestId: this.requestId, how: 'replay', afterSeq, attempt, error: this.lastBreak });
        await this.backoff(attempt);
      }
      const headers = new Headers({ accept: 'text/event-stream' });
      // None at all from the start: the current attempt's frames, whatever number they start at.
      if (afterSeq > 0) headers.set('last-event-id', String(afterSeq));
      // The Sarsen key only: with X-Sarsen-Key, Authorization carries a caller credential,
      // which a read by id does not need and so is not sent again.
      const given = new Headers(this.init.headers);
      const sarsenKey = given.get(SARSEN_KEY);
      const bearer = given.get('authorization');
      if (sarsenKey !== null) headers.set(SARSEN_KEY, sarsenKey);
      else if (bearer !== null) headers.set('authorization', bearer);
      const at = `${new URL(this.url).origin}${new URL(this.url).pathname.replace(SUBMISSION_PATH, '')}/requests/${encodeURIComponent(this.requestId!)}`;
      let conn: Connection;
      try {
        conn = await this.connection((signal) => this.base(at, { method: 'GET', headers, signal }));
      } catch (err) {
        if (this.signal?.aborted) throw err;
        this.lastBreak = err;
        continue;
      }
      if (conn.res.ok) return conn;
      conn.drop();
      // Gone for good (404, 410) or refused: no try helps. A 5xx is a process in trouble: try again.
      if (conn.res.status < 500 && conn.res.status !== 429) {
        throw new DurableFetchError('lost', `Resuming request ${this.requestId} by id answered ${conn.res.status}.`, this.requestId);
      }
      this.lastBreak = new Error(`resume answered ${conn.res.status}`);
    }
  }

  /**
   * A whole answer's body (an answer, or a refusal as the provider gave it). Should its
   * transfer break, the body is sent again attach-only, inside the window, and the bytes already
   * handed on are skipped.
   */
  private wholeBody(first: Response): ReadableStream<Uint8Array> {
    let conn: Connection | null = new Connection(first, null, this.o.stallMs);
    let delivered = 0;
    let skip = 0;
    return new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        for (let attempt = 0; ; ) {
          if (conn === null) {
            attempt++;
            try {
              if (attempt > this.o.retries) throw new DurableFetchError('gave_up', `The answer broke off and ${this.o.retries} tries to fetch it again failed.`, this.requestId, this.lastBreak);
              this.o.onResume?.({ requestId: this.requestId, how: 'attach', afterSeq: null, attempt, error: this.lastBreak });
              await this.backoff(attempt);
              this.checkWindow(true, this.lastBreak);
              const again = await this.connection((signal) => this.sendBody(true, signal));
              if (again.res.headers.get(REQUEST_ID) !== this.requestId || again.res.body === null) {
                again.drop();
                throw new DurableFetchError('lost', `Request ${this.requestId} could not be attached to again (${again.res.status}).`, this.requestId);
              }
              conn = again;
              skip = delivered;
            } catch (err) {
              if (err instanceof DurableFetchError || this.signal?.aborted) return controller.error(err);
              this.lastBreak = err;
              continue;
            }
          }
          const read = await this.readOrBreak(conn);
          if (read === 'aborted') return controller.error(this.signal?.reason);
          if (read === 'broke') {
            conn = null;
            continue;
          }
          if (read.done) return controller.close();
          let bytes = read.value;
          if (skip > 0) {
            const cut = Math.min(skip, bytes.length);
            skip -= cut;
            bytes = bytes.subarray(cut);
          }
          if (bytes.length === 0) continue;
          delivered += bytes.length;
          controller.enqueue(bytes);
          return;
        }
      },
      cancel: () => {
        conn?.drop();
      },
    });
  }
}

/** A response being read, with a stall bound on every read. */
class Connection {
  readonly res: Response;
  private readonly own: AbortController | null;
  private readonly reader: ReadableStreamDefaultReader<Uint8Array> | null;
  private readonly stallMs: number;

  constructor(res: Response, own: AbortController | null, stallMs: number) {
    this.res = res;
    this.own = own;
    this.reader = res.body?.getReader() ?? null;
    this.stallMs = stallMs;
  }

  read(): Promise<ReadResult> {
    const reader = this.reader;
    if (reader === null) return Promise.resolve({ done: true, value: undefined });
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(new Error(`No byte for ${this.stallMs} ms: taken as a broken connection.`));
        this.drop();
      }, this.stallMs);
      reader.read().then(
        (r) => {
          clearTimeout(timer);
          resolve(r);
        },
        (err: unknown) => {
          clearTimeout(timer);
          reject(err);
        },
      );
    });
  }

  drop(): void {
    this.own?.abort();
    this.reader?.cancel().catch(() => {});
  }
}

function neverSent(err: unknown): boolean {
  const code = (err as { cause?: { code?: unknown } } | null)?.cause?.code;
  return typeof code === 'string' && NEVER_SENT.has(code);
}

const encoder = new TextEncoder();
const KEEP_ALIVE_BYTES = encoder.encode(KEEP_ALIVE);

function startsWith(bytes: Uint8Array, text: string): boolean {
  const t = encoder.encode(text);
  if (bytes.length < t.length) return false;
  for (let i = 0; i < t.length; i++) if (bytes[i] !== t[i]) return false;
  return true;
}

function isKeepAlive(frame: Uint8Array): boolean {
  return frame.length === KEEP_ALIVE_BYTES.length && startsWith(frame, KEEP_ALIVE);
}

/** A replayed frame's leading `id: <seq>\n` line: its sequence number and its length in bytes. */
function idLine(frame: Uint8Array): { seq: number; length: number } | null {
  if (!startsWith(frame, 'id: ')) return null;
  const lf = frame.indexOf(0x0a);
  if (lf === -1) return null;
  const seq = Number(new TextDecoder().decode(frame.subarray(4, lf)));
  return Number.isSafeInteger(seq) ? { seq, length: lf + 1 } : null;
}

/**
 * Finds SSE frame boundaries the way Sarsen stores frames (a frame ends at a blank line; `\n`,
 * `\r\n` and `\r` line ends), so counting frames here counts Sarsen's sequence numbers.
 */
function createFramer() {
  let held: Uint8Array = new Uint8Array(0);
  let atLineStart = true;
  let afterCR = false;
  let endPending = false;
  const join = (a: Uint8Array, b: Uint8Array): Uint8Array => {
    if (a.length === 0) return b.slice();
    const out = new Uint8Array(a.length + b.length);
    out.set(a);
    out.set(b, a.length);
    return out;
  };
  return {
    push(chunk: Uint8Array): Uint8Array[] {
      const frames: Uint8Array[] = [];
      let start = 0;
      const cut = (to: number) => {
        frames.push(join(held, chunk.subarray(start, to)));
        held = new Uint8Array(0);
        start = to;
      };
      for (let i = 0; i < chunk.length; ) {
        const b = chunk[i]!;
        if (endPending) {
          cut(b === 0x0a ? i + 1 : i);
          i = start;
          endPending = afterCR = false;
          atLineStart = true;
          continue;
        }
        if (afterCR) {
          afterCR = false;
          if (b === 0x0a) {
            i++;
            continue;
          }
        }
        if (b === 0x0a || b === 0x0d) {
          if (!atLineStart) {
            atLineStart = true;
            afterCR = b === 0x0d;
          } else if (b === 0x0a) {
            cut(i + 1);
          } else {
            endPending = true;
          }
          i++;
          continue;
        }
        atLineStart = false;
        i++;
      }
      if (start < chunk.length) held = join(held, chunk.subarray(start));
      return frames;
    },
    /** What is left at the end: a last frame without its blank line. */
    end(): Uint8Array[] {
      const rest = held.length > 0 ? [held] : [];
      held = new Uint8Array(0);
      atLineStart = true;
      afterCR = endPending = false;
      return rest;
    },
    reset(): void {
      this.end();
    },
  };
}
