// The response cache's pure parts (docs/api.md "Response cache"): the caller's X-Sarsen-Cache
// header, how long an answer may be served for, the key an answer is stored under, and which
// streamed answers may be served at all: not one the provider ended with its own failure, nor
// one that stopped before its dialect's last event.
import crypto from 'node:crypto';
import { frameEvent } from './sse-framer.ts';
import type { Dialect } from './dialects.ts';

export const CACHE_HEADER = 'x-sarsen-cache';

/** What a submission asks of the cache: nothing (the namespace's life), none of it, or a shorter life. */
export type CacheDirective = { kind: 'default' } | { kind: 'no-store' } | { kind: 'max-age'; seconds: number };

// One directive; max-age in whole seconds, as HTTP writes it. Case and surrounding blanks do not matter.
const MAX_AGE = /^max-age=(\d{1,10})$/;

/** The header's directive; a string naming why when the value is not one Sarsen reads. */
export function parseCacheHeader(value: string | string[] | undefined): CacheDirective | string {
  if (value === undefined) return { kind: 'default' };
  const v = (Array.isArray(value) ? value.join(',') : value).trim().toLowerCase();
  if (v === 'no-store') return { kind: 'no-store' };
  const m = MAX_AGE.exec(v);
  if (m) return { kind: 'max-age', seconds: Number(m[1]) };
  return 'X-Sarsen-Cache takes one directive: `no-store`, or `max-age=N` with N whole seconds.';
}

/**
 * What the cache does for a submission: how old an answer may be and still be served
 * (milliseconds: the namespace's life, shortened, never lengthened, by max-age; 0 for
 * no-store), and whether its own answer may be served later (not with no-store). Null: the
 * namespace has no cache, and deduplication alone applies.
 */
export function cachePolicy(namespaceTtlMinutes: number | null, directive: CacheDirective): { lifeMs: number; store: boolean } | null {
  if (namespaceTtlMinutes === null) return null;
  const life = namespaceTtlMinutes * 60_000;
  if (directive.kind === 'no-store') return { lifeMs: 0, store: false };
  return { lifeMs: directive.kind === 'max-age' ? Math.min(life, directive.seconds * 1000) : life, store: true };
}

/**
 * The key an answer is stored and found under: the body's idempotency identity (dialect,
 * canonical body and, for caller-credential backends, the credential's keyed hash) with the
 * backend the routing rule resolved and the model it sends, so a rule pointed elsewhere never
 * serves the old backend's answers.
 */
export function cacheKey(identity: Buffer, backendId: string, upstreamModel: string): Buffer {
  return crypto.createHash('sha256').update(identity).update('\0').update(backendId).update('\0').update(upstreamModel).digest();
}

// Events by which a provider ends a stream with its own failure: `error` (messages, and the
// Responses API's error event), `response.failed`, and `response.error`, which the Responses
// reference does not define but would mean the same. `response.incomplete` is not one: it is an
// answer cut short by its token limit, as a chat `finish_reason: "length"` is.
const FAILURE_EVENTS = new Set(['error', 'response.failed', 'response.error']);
// Every failure frame holds one of these; most frames hold neither and are never decoded.
const ERROR = Buffer.from('error');
const FAILED = Buffer.from('failed');

/**
 * Whether a stream frame is the provider's own failure (docs/api.md "Response cache"): an event
 * named, or typed in its data, as above, or data carrying an `error` member (a chat provider's
 * mid-stream error, and what the official SDKs throw on). The request still succeeds, as the
 * provider answered 200, but its answer is never served from the cache.
 */
export function isProviderFailureFrame(frame: Buffer): boolean {
  if (!frame.includes(ERROR) && !frame.includes(FAILED)) return false;
  const { event, data } = frameEvent(frame);
  if (event !== undefined && FAILURE_EVENTS.has(event)) return true;
  let parsed: unknown;
  try {
    parsed = JSON.parse(data);
  } catch {
    return false;
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) return false;
  const o = parsed as Record<string, unknown>;
  return (typeof o.type === 'string' && FAILURE_EVENTS.has(o.type)) || Boolean(o.error);
}

// The event each dialect closes a whole stream with; a frame holding none of the marker bytes is
// never decoded. `response.incomplete` ends a whole answer too, one cut short by its token limit.
const STREAM_ENDS: Readonly<Record<Dialect, { markers: readonly Buffer[]; events: ReadonlySet<string> }>> = {
  chat: { markers: [Buffer.from('[DONE]')], events: new Set() },
  messages: { markers: [Buffer.from('message_stop')], events: new Set(['message_stop']) },
  responses: { markers: [Buffer.from('response.completed'), Buffer.from('response.incomplete')], events: new Set(['response.completed', 'response.incomplete']) },
};

/**
 * Whether a stream frame is its dialect's last event (docs/api.md "Response cache"): chat's
 * `data: [DONE]`, messages' `message_stop`, or the Responses API's `response.completed` or
 * `response.incomplete`, named as the event or as its data's `type`. A stream whose provider
 * closed the connection before such a frame succeeded, but may be cut short, and is not served
 * from the cache.
 */
export function isStreamEndFrame(dialect: Dialect, frame: Buffer): boolean {
  const end = STREAM_ENDS[dialect];
  if (!end.markers.some((m) => frame.includes(m))) return false;
  const { event, data } = frameEvent(frame);
  if (dialect === 'chat') return data.trim() === '[DONE]';
  if (event !== undefined) return end.events.has(event);
  try {
    const parsed: unknown = JSON.parse(data);
    return typeof parsed === 'object' && parsed !== null && end.events.has((parsed as { type?: unknown }).type as string);
  } catch {
    return false;
  }
}
