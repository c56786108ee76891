// The provider call: undici with keep-alive, the deployment's timeouts, and the address
// policy enforced again at connect time (DNS can change after a backend was created).
import { Agent, request } from 'undici';
import diagnostics from 'node:diagnostics_channel';
import { isIP, type Socket } from 'node:net';
import type { Readable } from 'node:stream';
import type { Settings } from '../config/settings.ts';
import { policyLookup, refusalReason, HOST_REFUSED_CODE } from '../core/address-policy.ts';
import { upstreamHeaders } from '../core/header-policy.ts';
import { upstreamPath, type Dialect } from '../core/dialects.ts';
import { logger } from '../log.ts';

/**
 * What a call put on the wire, filled in as it happens: whether a connection to the provider
 * carried the request, and how many bytes were written to it (request line, headers, body).
 * A call that never connected (a refused or timed-out connection, a refused address) reached
 * no provider and sent nothing.
 */
export type Sent = { reached: boolean; bytes: number };

export type UpstreamCall = {
  dialect: Dialect;
  address: string;
  credential: string | null;
  forwarded: readonly (readonly [string, string])[];
  hops: number;
  body: string;
  streaming: boolean;
  signal: AbortSignal;
  sent: Sent;
};

export type UpstreamResponse = {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  /** undici's body: a Node stream. */
  body: Readable;
};

/** A failure that was not an HTTP answer from the provider. */
export class TransportError extends Error {
  override name = 'TransportError';
  readonly refused: boolean;
  constructor(message: string, opts: { refused?: boolean; cause?: unknown } = {}) {
    super(message, { cause: opts.cause });
    this.refused = opts.refused ?? false;
  }
}

export function upstreamUrl(dialect: Dialect, address: string): string {
  return `${address}${upstreamPath(dialect)}`;
}

export type Upstream = {
  call(c: UpstreamCall, settings: Settings): Promise<UpstreamResponse>;
  close(): Promise<void>;
};

type RequestMessage = { request: object };

/**
 * Meters calls through undici's diagnostics channels, which it publishes synchronously from
 * inside the client, one request object shared by every channel of a request. A call's
 * meter is tied to that object when undici creates it (synchronously inside `request()`);
 * `sendHeaders` says a connection now carries it, and the socket's byte count from then until
 * `bodySent` is what was written for it (undici writes one request at a time per connection).
 */
function createMeters() {
  type Meter = { sent: Sent; socket: Socket | null; start: number };
  const meters = new WeakMap<object, Meter>();
  let creating: Meter | null = null;
  let warned = false;
  const onCreate = (m: unknown) => {
    if (creating === null) return;
    meters.set((m as RequestMessage).request, creating);
    creating = null;
  };
  const onSendHeaders = (m: unknown) => {
    const { request, socket } = m as RequestMessage & { socket: Socket };
    const meter = meters.get(request);
    if (!meter) return;
    meter.sent.reached = true;
    meter.socket = socket;
    meter.start = socket.bytesWritten;
  };
  const onBodySent = (m: unknown) => {
    const meter = meters.get((m as RequestMessage).request);
    if (meter?.socket) meter.sent.bytes = meter.socket.bytesWritten - meter.start;
  };
  const channels = [
    ['undici:request:create', onCreate],
    ['undici:client:sendHeaders', onSendHeaders],
    ['undici:request:bodySent', onBodySent],
  ] as const;
  for (const [name, fn] of channels) diagnostics.subscribe(name, fn);
  return {
    /** Runs `start` (which must call undici's request() synchronously) with `sent` as its meter. */
    metered<T>(sent: Sent, start: () => T): T {
      creating = { sent, socket: null, start: 0 };
      try {
        return start();
      } finally {
        creating = null;
      }
    },
    /** A call was answered without its meter seeing it go out: undici no longer announces calls as above. */
    missed() {
      if (warned) return;
      warned = true;
      logger.warn('undici did not announce a provider call; provider calls and sent bytes go uncounted');
    },
    close() {
      for (const [name, fn] of channels) diagnostics.unsubscribe(name, fn);
    },
  };
}

export function createUpstream(): Upstream {
  const meters = createMeters();
  const agents = new Map<string, Agent>();
  const agentFor = (s: Settings): Agent => {
    const key = `${s.backends_public_only}:${s.upstream_connect_timeout_ms}:${s.upstream_headers_timeout_ms}:${s.upstream_idle_timeout_ms}`;
    let agent = agents.get(key);
    if (!agent) {
      agent = new Agent({
        keepAliveTimeout: 30_000,
        headersTimeout: s.upstream_headers_timeout_ms,
        bodyTimeout: s.upstream_idle_timeout_ms,
        connect: { timeout: s.upstream_connect_timeout_ms, ...(s.backends_public_only ? { lookup: policyLookup() } : {}) },
      });
      agents.set(key, agent);
    }
    return agent;
  };

  return {
    async call(c, settings) {
      const url = new URL(upstreamUrl(c.dialect, c.address));
      const host = url.hostname.replace(/^\[|\]$/g, '');
      // Literal addresses never reach a resolver, so the policy is applied to them here.
      if (settings.backends_public_only && isIP(host) !== 0) {
        const reason = refusalReason(host);
        if (reason) throw new TransportError(`The backend address is refused: ${reason}.`, { refused: true });
      }
      const body = Buffer.from(c.body, 'utf8');
      const headers = upstreamHeaders(c.dialect, {
        credential: c.credential,
        forwarded: c.forwarded as [string, string][],
        hops: c.hops + 1,
        contentLength: body.length,
        accept: c.streaming ? 'text/event-stream' : 'application/json',
      });
      try {
        const dispatcher = agentFor(settings);
        const res = await meters.metered(c.sent, () => request(url, { method: 'POST', headers, body, signal: c.signal, dispatcher }));
        if (!c.sent.reached) meters.missed();
        return { status: res.statusCode, headers: res.headers, body: res.body };
      } catch (err) {
        throw describeTransportError(err);
      }
    },
    async close() {
      await Promise.all([...agents.values()].map((a) => a.close()));
      agents.clear();
      meters.close();
    },
  };
}

/** Says what went wrong in words a caller can act on, without echoing anything sensitive. */
export function describeTransportError(err: unknown): TransportError {
  if (err instanceof TransportError) return err;
  const e = err as { code?: string; name?: string; message?: string; cause?: { code?: string } };
  const code = e.code ?? e.cause?.code;
  if (code === HOST_REFUSED_CODE) return new TransportError('The backend address resolves to a refused network.', { refused: true, cause: err });
  const known: Record<string, string> = {
    ECONNREFUSED: 'The provider refused the connection.',
    ECONNRESET: 'The provider closed the connection.',
    ENOTFOUND: 'The provider host did not resolve.',
    EAI_AGAIN: 'The provider host did not resolve (temporary DNS failure).',
    UND_ERR_CONNECT_TIMEOUT: 'Connecting to the provider timed out.',
    UND_ERR_HEADERS_TIMEOUT: 'The provider sent no response headers in time.',
    UND_ERR_BODY_TIMEOUT: 'The provider went silent in the middle of its answer.',
    UND_ERR_SOCKET: 'The provider connection failed.',
    UND_ERR_ABORTED: 'The call was aborted.',
    ABORT_ERR: 'The call was aborted.',
  };
  const message = (code && known[code]) || (e.name === 'AbortError' ? 'The call was aborted.' : 'The provider could not be reached.');
  return new TransportError(message, { cause: err });
}
