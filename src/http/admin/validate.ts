// Payload validation for the administration routes: zod at the edge, every refusal a
// `400 bad_request` naming the field; unknown fields are refused, not ignored.
import { z } from 'zod';
import type { Request } from 'express';
import { readJsonDocument } from '../body.ts';
import { ServiceError } from '../../core/errors.ts';

function describeIssue(issue: z.core.$ZodIssue): string {
  if (issue.code === 'unrecognized_keys') {
    const keys = issue.keys.map((k) => JSON.stringify(k)).join(', ');
    const where = issue.path.length > 0 ? ` in ${issue.path.join('.')}` : '';
    return `unknown field${issue.keys.length > 1 ? 's' : ''} ${keys}${where}`;
  }
  const field = issue.path.length > 0 ? issue.path.join('.') : 'body';
  return `${field}: ${issue.message}`;
}

/** Validates a parsed document; the first problem becomes the 400's message. */
export function parsePayload<T>(schema: z.ZodType<T>, value: unknown): T {
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new ServiceError('bad_request', describeIssue(parsed.error.issues[0]!));
  return parsed.data;
}

/** Reads the JSON body (415, 413 and malformed JSON handled by readJsonDocument) and validates it. */
export async function readPayload<T>(req: Request, schema: z.ZodType<T>): Promise<T> {
  return parsePayload(schema, await readJsonDocument(req));
}

// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f]/;

/** A display string: 1..max characters, no control characters. */
export const text = (max: number) =>
  z
    .string()
    .min(1, 'must not be empty')
    .max(max, `must be at most ${max} characters`)
    .refine((s) => !CONTROL.test(s), 'must not contain control characters');

/** The id of another resource named in a payload (a rule's backend_id): no control characters. */
export const reference = z
  .string()
  .max(64, 'must be at most 64 characters')
  .refine((s) => !CONTROL.test(s), 'must not contain control characters');

export const INT4_MAX = 2_147_483_647;

/** Minutes of retention: an integer ≥ 0, or null for unset. */
export const retentionMinutes = z.number().int('must be an integer').min(0, 'must be 0 or more').max(INT4_MAX).nullable();

/** A spend cap in micro-credits: an integer ≥ 0, or null for none. */
export const spendLimit = z.number().int('must be an integer').min(0, 'must be 0 or more').max(Number.MAX_SAFE_INTEGER).nullable();

const perMinute = z.number().int('must be an integer').min(1, 'must be 1 or more').nullable();

/** A key's rate limits; a limit left out or null is off (docs/administration.md "Rate limits"). */
export const keyLimits = z
  .strictObject({
    requests_per_minute: perMinute.refine((n) => n === null || n <= INT4_MAX, `must be at most ${INT4_MAX}`).optional(),
    tokens_per_minute: perMinute.refine((n) => n === null || n <= Number.MAX_SAFE_INTEGER, 'is too large').optional(),
  })
  .nullable();

/** Minutes an answer may be served from the response cache: an integer ≥ 1, or null for no cache. */
export const cacheTtlMinutes = z.number().int('must be an integer').min(1, 'must be 1 or more (null turns the cache off)').max(INT4_MAX).nullable();

export const EMAIL_MAX = 254;
// eslint-disable-next-line no-control-regex
const EMAIL_RE = /^[^\s@\u0000-\u001f\u007f]+@[^\s@\u0000-\u001f\u007f]+$/;

/** An email address, trimmed and lower-cased (accounts are matched case-insensitively). */
export const email = z
  .string()
  .trim()
  .toLowerCase()
  .max(EMAIL_MAX, `must be at most ${EMAIL_MAX} characters`)
  .regex(EMAIL_RE, 'must be an email address');

export function isoTime(d: Date | null): string | null {
  return d === null ? null : d.toISOString();
}
