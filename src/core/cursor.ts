// Opaque paging cursors: the position, bound to its scope and signed, so a cursor cannot be
// forged, tampered with or carried to another namespace. A bad one is a 400, never a guess.
import crypto from 'node:crypto';

const SIG_BYTES = 12;

function sign(key: Buffer, scope: string, position: string): string {
  return crypto.createHmac('sha256', key).update(`sarsen-cursor\0${scope}\0${position}`).digest().subarray(0, SIG_BYTES).toString('base64url');
}

export function encodeCursor(key: Buffer, scope: string, position: string): string {
  return `${Buffer.from(position, 'utf8').toString('base64url')}.${sign(key, scope, position)}`;
}

/** The position, or null when the cursor is malformed or not this scope's. */
export function decodeCursor(key: Buffer, scope: string, cursor: string): string | null {
  const m = /^([A-Za-z0-9_-]{1,200})\.([A-Za-z0-9_-]{16})$/.exec(cursor);
  if (!m) return null;
  const position = Buffer.from(m[1]!, 'base64url').toString('utf8');
  const expected = Buffer.from(sign(key, scope, position));
  const given = Buffer.from(m[2]!);
  return given.length === expected.length && crypto.timingSafeEqual(given, expected) ? position : null;
}
