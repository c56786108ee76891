// Where a top-level member's value sits in a JSON text, so a tool can pass the value on as it
// was written (number spellings, key order, escapes, whitespace) instead of re-serialising it.
// The text must already be known to be a JSON object (JSON.parse accepted it): this only scans.

const WS = new Set([' ', '\t', '\n', '\r']);

/** The index just past the string whose opening quote is at `i`. */
function skipString(text: string, i: number): number {
  for (let j = i + 1; ; j++) {
    const ch = text[j];
    if (ch === '\\') j++;
    else if (ch === '"') return j + 1;
    else if (ch === undefined) throw new Error('unterminated string');
  }
}

/** The index just past the value starting at `i` (no leading whitespace). */
function skipValue(text: string, i: number): number {
  const ch = text[i];
  if (ch === '"') return skipString(text, i);
  if (ch === '{' || ch === '[') {
    let depth = 0;
    for (let j = i; j < text.length; ) {
      const c = text[j]!;
      if (c === '"') {
        j = skipString(text, j);
        continue;
      }
      if (c === '{' || c === '[') depth++;
      else if (c === '}' || c === ']') {
        depth--;
        if (depth === 0) return j + 1;
      }
      j++;
    }
    throw new Error('unterminated value');
  }
  let j = i;
  while (j < text.length && !WS.has(text[j]!) && text[j] !== ',' && text[j] !== '}' && text[j] !== ']') j++;
  return j;
}

function skipWs(text: string, i: number): number {
  while (WS.has(text[i]!)) i++;
  return i;
}

/**
 * The [start, end) of the value of the object's member `key` (its last occurrence, as
 * JSON.parse keeps), or null when the object has no such member. Keys are compared decoded,
 * so `"\u0062ody"` is `body`.
 */
export function topLevelValueSpan(text: string, key: string): [number, number] | null {
  let i = skipWs(text, 0);
  if (text[i] !== '{') throw new Error('not a JSON object');
  i = skipWs(text, i + 1);
  let found: [number, number] | null = null;
  while (text[i] === '"') {
    const keyEnd = skipString(text, i);
    const name = JSON.parse(text.slice(i, keyEnd)) as string;
    i = skipWs(text, keyEnd);
    if (text[i] !== ':') throw new Error('expected a colon');
    const start = skipWs(text, i + 1);
    const end = skipValue(text, start);
    if (name === key) found = [start, end];
    i = skipWs(text, end);
    if (text[i] === ',') i = skipWs(text, i + 1);
  }
  return found;
}
