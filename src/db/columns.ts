// Batch statements take their rows as parallel arrays (one parameter per column, unnested in
// SQL). A binary column is the exception: an array of bytea travels as hex text, twice its
// size, encoded in JavaScript and decoded again by PostgreSQL. Instead its values go back to
// back in one binary parameter, with an array of their sizes to cut it apart.

/**
 * A column as PostgreSQL's array literal, for a `$n::text[]` (int[], bigint[], boolean[],
 * bytea[]) parameter, built in one go: pg's own encoder escapes every element with two regular
 * expressions and grows the literal a piece at a time, a large share of what a request allocates.
 */
export type Element = string | number | boolean | Buffer | null | undefined;

export function arrayLiteral(values: readonly Element[]): string {
  return columnLiteral(values, (v) => v);
}

/** arrayLiteral of `value(row)` for each row, without an array of the values between. */
function columnLiteral<T>(rows: readonly T[], value: (row: T) => Element): string {
  let literal = '{';
  for (let i = 0; i < rows.length; i++) {
    if (i > 0) literal += ',';
    const v = value(rows[i]!);
    if (v === null || v === undefined) literal += 'NULL';
    else if (typeof v === 'string') literal += `"${escapeElement(v)}"`;
    else if (Buffer.isBuffer(v)) literal += `"\\\\x${v.toString('hex')}"`;
    else literal += String(v);
  }
  return `${literal}}`;
}

/**
 * Inside a quoted element only the quote and the backslash are special: each gets a backslash.
 * A body is JSON, full of quotes: the runs between them are copied whole, not matched one by one.
 */
function escapeElement(v: string): string {
  let from = 0;
  let out = '';
  for (let i = 0; i < v.length; i++) {
    const c = v.charCodeAt(i);
    if (c === QUOTE || c === BACKSLASH) {
      out += `${v.slice(from, i)}\\`;
      from = i;
    }
  }
  return out === '' ? v : out + v.slice(from);
}
const QUOTE = 0x22;
const BACKSLASH = 0x5c;

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
 * Reading is the mirror case: bytea comes back as hex text, twice its size, then decoded into a
 * Buffer. (Binary results are not an option: pg decodes every field of a text-mode connection
 * as UTF-8 text.) A large value read often (stream pages, slices of a large answer) is read as
 * `Bytes` instead: text whose characters are its bytes, one each (latin1). On a UTF-8
 * connection that costs a byte per ASCII byte on the wire, a one-byte string in JavaScript, no
 * Buffer, and a socket writes it back as the same bytes (`write(text, 'latin1')`). Text cannot
 * hold NUL, so a value with a NUL byte (or a connection in another encoding) comes as base64.
 */
export type Bytes = Buffer | string;

/**
 * SQL of the bytea `value` as one text column for `bytesFrom`: `t` and the text, or `b` and
 * base64 (one CASE, so the value is decompressed for the test and once more for the result).
 */
export function selectBytes(value: string): string {
  const asText = `position('\\x00'::bytea IN ${value}) = 0 AND (SELECT current_setting('server_encoding') = 'UTF8' AND current_setting('client_encoding') = 'UTF8')`;
  return `CASE WHEN ${asText} THEN 't' || convert_from(${value}, 'LATIN1') ELSE 'b' || encode(${value}, 'base64') END`;
}

/** A value read through `selectBytes`; null for a null value. */
export const bytesFrom = (tagged: string | null): Bytes | null =>
  tagged === null ? null : tagged.startsWith('t') ? tagged.slice(1) : Buffer.from(tagged.slice(1), 'base64');

/** The element type of a batch column; `binary` is bytea travelling packed (see binaryColumn). */
type ColumnType = 'text' | 'int' | 'bigint' | 'boolean' | 'bytea' | 'binary';

/** One column of a batch statement's rows: its name in SQL, its type, and its value for a row. */
export type Column<T> =
  | readonly [name: string, type: Exclude<ColumnType, 'binary'>, value: (row: T) => Element]
  | readonly [name: string, type: 'binary', value: (row: T) => Buffer | null];

/**
 * A batch statement's parameters, generated from one table of columns and one of scalars, so
 * the SQL and the values cannot disagree by position. The parameters are numbered in order:
 * one array per column, then the packed data of each binary column, then the scalars.
 */
export type BatchInput<T, S> = Readonly<{
  /** `unnest($1::text[], ...) [WITH ORDINALITY] AS alias(column, ..., [ord])`; a binary column appears as its `<name>_size`. */
  unnest(alias: string, ordinality?: boolean): string;
  /** A query of the rows: every column (a binary one cut from its data) and `ord`, their position from 1. */
  rows: string;
  /** A column's whole array (`$1::text[]`), e.g. for an `= ANY(...)` index condition. */
  array(column: string): string;
  /** A scalar parameter, cast to its type (`$21::smallint`). */
  param(name: keyof S & string): string;
  /** The parameter values, in the order of their numbers. */
  values(rows: readonly T[], scalars: S): unknown[];
}>;

export function batchInput<T, S extends Record<string, unknown> = Record<never, never>>(
  columns: readonly Column<T>[],
  scalars: { readonly [K in keyof S]: string } = {} as { [K in keyof S]: string },
): BatchInput<T, S> {
  const binary = columns.filter(([, type]) => type === 'binary');
  const scalarNames = Object.keys(scalars) as (keyof S & string)[];
  const arrayOf = (column: Column<T>) => `$${columns.indexOf(column) + 1}::${column[1] === 'binary' ? 'int' : column[1]}[]`;
  const unnest = (alias: string, ordinality = false) => {
    const names = columns.map(([name, type]) => (type === 'binary' ? `${name}_size` : name));
    if (ordinality) names.push('ord');
    return `unnest(${columns.map(arrayOf).join(', ')})${ordinality ? ' WITH ORDINALITY' : ''} AS ${alias}(${names.join(', ')})`;
  };
  const slices = binary.map(([name], i) => `, ${binarySlice(`$${columns.length + i + 1}::bytea`, `t.${name}_size`, 't.ord')} AS ${name}`);
  return {
    unnest,
    rows: `SELECT t.*${slices.join('')}\n    FROM ${unnest('t', true)}`,
    array(name) {
      const column = columns.find(([n]) => n === name);
      if (!column) throw new Error(`the batch has no column ${name}`);
      return arrayOf(column);
    },
    param: (name) => `$${columns.length + binary.length + scalarNames.indexOf(name) + 1}::${scalars[name]}`,
    values(rows, given) {
      const values: unknown[] = [];
      const data: Buffer[] = [];
      for (const column of columns) {
        if (column[1] === 'binary') {
          const packed = binaryColumn(rows.map(column[2]));
          values.push(arrayLiteral(packed.sizes));
          data.push(packed.data);
        } else values.push(columnLiteral(rows, column[2]));
      }
      values.push(...data);
      for (const name of scalarNames) values.push(given[name]);
      return values;
    },
  };
}

/**
 * A statement's parameters by name, for one that is not a batch (a batch input without
 * columns): `param('id')` is its `$n::type`, `values({...})` the values in their order.
 */
export type NamedParams<S> = Readonly<{ param(name: keyof S & string): string; values(given: S): unknown[] }>;

export function namedParams<S extends Record<string, unknown>>(types: { readonly [K in keyof S]: string }): NamedParams<S> {
  const input = batchInput<never, S>([], types);
  return { param: input.param, values: (given) => input.values([], given) };
}

/**
 * SQL: `column` is at least the least id of the array parameter `ids`. A bound the executor
 * evaluates as it starts, so a generic plan of a partitioned table prunes every partition below
 * the batch's oldest id before opening one (migration 027; docs/storage.md "Cost of many
 * partitions"). Without it, a statement naming its rows by an array probes every partition.
 */
export const notBelowIds = (column: string, ids: string): string => `${column} >= sarsen.least_id(${ids})`;

/** SQL: `column` is one of the ids of the array parameter `ids`, the partitions below them pruned (notBelowIds). */
export const oneOfIds = (column: string, ids: string): string => `${column} = ANY(${ids}) AND ${notBelowIds(column, ids)}`;

/** One named part of a statement: `name AS [MATERIALIZED] (sql)` in its WITH list. */
export type Part = Readonly<{ name: string; sql: string; materialized?: boolean }>;

/** `WITH a AS (...), b AS (...) <select>`: a statement from its parts, in order. */
export function withParts(parts: readonly Part[], select: string): string {
  return `WITH ${parts.map((p) => `${p.name} AS ${p.materialized ? 'MATERIALIZED ' : ''}(\n  ${p.sql}\n)`).join(', ')}\n${select}`;
}
