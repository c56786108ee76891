// PostgreSQL error classes the application turns into answers (SQLSTATE codes).

function sqlState(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

/** A unique constraint refused the write (a duplicate name, a prefix collision). */
export function isUniqueViolation(err: unknown, constraint?: string): boolean {
  if (sqlState(err) !== '23505') return false;
  return constraint === undefined || (err as { constraint?: unknown }).constraint === constraint;
}

/** A foreign key refused the write (a row still referenced, or a reference to nothing). */
export function isForeignKeyViolation(err: unknown): boolean {
  return sqlState(err) === '23503';
}

/** PostgreSQL refused text holding U+0000: `text` cannot store it (22021), nor `jsonb` as `\u0000` (22P05). */
export function isNulRefused(err: unknown): boolean {
  const state = sqlState(err);
  return state === '22021' || state === '22P05';
}
