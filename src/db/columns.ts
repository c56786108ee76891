// Batch statements take their rows as parallel arrays (one parameter per column, unnested in
// SQL). A binary column is the exception: an array of bytea travels as hex text, twice its
// size, encoded in JavaScript and decoded again by PostgreSQL. Instead its values go back to
// back in one binary parameter, with an array of their sizes to cut it apart.

/**
 * A column as PostgreSQL's array literal, for a `$n::text[]` (int[], bigint[], boolean[],
 * bytea[]) parameter, built in one go. pg's own encoder escapes every element with two regular
 * expressions and grows the literal a piece at a time: at c=64 that was a tenth of all a
 * request allocated (8 of 80 KB), in three batch statements per request.
 */
export type Element = string | number | boolean | Buffer | null | undefined;

export function arrayLiteral(values: readonly Element[]): string {
  const parts = new Array<string>(values.length);
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v === null || v === undefined) parts[i] = 'NULL';
    else if (typeof v === 'string') parts[i] = ESCAPED.test(v) ? `"${v.replace(ESCAPE, '\\$&')}"` : `"${v}"`;
    else if (Buffer.isBuffer(v)) parts[i] = `"\\\\x${v.toString('hex')}"`;
    else parts[i] = String(v);
  }
  return `{${parts.join(',')}}`;
}
// Inside a quoted element only the quote and the backslash are special.
const ESCAPED = /["\\]/;
const ESCAPE = /["\\]/g;

/** One binary parameter for a column of Buffers (null stays null: size -1), and the sizes to cut it at. */
export function binaryColumn(values: readonly (Buffer | null)[]): { data: Buffer; sizes: number[] } {
  return { data: Buffer.concat(values.filter((v): v is Buffer => v !== null)), sizes: values.map((v) => (v === null ? -1 : v.length)) };
}

/**
 * SQL of a row's value from a binaryColumn: `data` is the parameter holding the values, `size`
 * the row's size column and `ord` its ordinality (the window sums the sizes before it).
 */
export function binarySlice(data: string, size: string, ord: string): string {
  return `CASE WHEN ${size} >= 0 THEN substring(${data} FROM (sum(greatest(${size}, 0)) OVER (ORDER BY ${ord}) - ${size} + 1)::int FOR ${size}) END`;
}

/**
 * Reading is the mirror case: bytea comes back as hex text, twice its size, then decoded. A
 * large value read often (stream pages, slices of a large answer) is better selected as
 * `encode(col, 'base64')` (a third larger) and decoded with `fromBase64`. (Binary results are
 * not an option: pg decodes every field of a text-mode connection as UTF-8 text.)
 */
export const fromBase64 = (text: string | null): Buffer | null => (text === null ? null : Buffer.from(text, 'base64'));
