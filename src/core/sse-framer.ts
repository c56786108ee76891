// Byte-exact SSE framing: stored frames are replayed with `id:` lines in front, so they must
// concatenate back to the provider's bytes; this framer only finds boundaries and never changes a
// byte (the rules: docs/durability.md "Stream frames"; docs/api.md "Replay").

const LF = 0x0a;
const CR = 0x0d;

export type Framer = {
  /** Complete frames found so far, each including its blank-line ending. */
  push(chunk: Buffer): Buffer[];
  /** The final remainder (a frame without its blank line), if any bytes are left. Resets the framer. */
  end(): Buffer[];
};

/** Buffers only, never strings: a UTF-8 character may be split across reads. */
export function createFramer(): Framer {
  // Copies of the current frame's bytes from earlier pushes, concatenated once when the frame
  // completes; with each push scanning only its new bytes, work is linear in the bytes pushed.
  let held: Buffer[] = [];
  // No content byte yet on the current line (true at the start of a frame).
  let atLineStart = true;
  // The previous byte was `\r`: a `\n` now completes that same line ending.
  let afterCR = false;
  // The frame's blank line ended in `\r`; the next byte decides whether a `\n` joins it.
  let endPending = false;

  function take(chunk: Buffer, from: number, to: number): Buffer {
    const part = chunk.subarray(from, to);
    // Copy even a frame lying within one chunk: the caller may reuse its buffer.
    const frame = held.length === 0 ? Buffer.from(part) : Buffer.concat([...held, part]);
    held = [];
    return frame;
  }

  function push(chunk: Buffer): Buffer[] {
    const frames: Buffer[] = [];
    const n = chunk.length;
    let start = 0; // first byte of the current frame within this chunk
    let i = 0;
    // Next `\n` / `\r` at or after a position, cached so a chunk is scanned once
    // per byte value whatever its line count (`n` means none left).
    let nextLF = -1;
    let nextCR = -1;

    while (i < n) {
      if (endPending) {
        const cut = chunk[i] === LF ? i + 1 : i;
        frames.push(take(chunk, start, cut));
        start = i = cut;
        endPending = afterCR = false;
        atLineStart = true;
        continue;
      }
      const b = chunk[i];
      if (afterCR) {
        afterCR = false;
        if (b === LF) {
          i++;
          continue;
        }
      }
      if (b === LF || b === CR) {
        if (!atLineStart) {
          atLineStart = true;
          afterCR = b === CR;
        } else if (b === LF) {
          frames.push(take(chunk, start, i + 1));
          start = i + 1;
        } else {
          endPending = true;
        }
        i++;
        continue;
      }
      // Content: skip straight to the next line ending.
      atLineStart = false;
      if (nextLF < i) nextLF = indexOrEnd(chunk.indexOf(LF, i), n);
      if (nextCR < i) nextCR = indexOrEnd(chunk.indexOf(CR, i), n);
      i = Math.min(nextLF, nextCR);
    }

    if (start < n) held.push(Buffer.from(chunk.subarray(start)));
    return frames;
  }

  function end(): Buffer[] {
    const rest = held.length === 0 ? [] : [Buffer.concat(held)];
    held = [];
    atLineStart = true;
    afterCR = endPending = false;
    return rest;
  }

  return { push, end };
}

function indexOrEnd(index: number, n: number): number {
  return index === -1 ? n : index;
}

export type FrameEvent = { event?: string; data: string };

/**
 * Reads one frame as an SSE reader would: the last `event:` value, and the
 * `data:` values joined with `\n`. Comments, `id:`, `retry:` and unknown fields
 * are ignored. For reading only (token usage, tests); never for storage.
 */
export function frameEvent(frame: Buffer): FrameEvent {
  let text = frame.toString('utf8');
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
  const data: string[] = [];
  let event: string | undefined;
  for (const line of text.split(/\r\n|\r|\n/)) {
    if (line === '' || line.charCodeAt(0) === 0x3a /* ':' comment */) continue;
    const colon = line.indexOf(':');
    const name = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? '' : line.slice(colon + 1);
    if (value.charCodeAt(0) === 0x20) value = value.slice(1);
    if (name === 'data') data.push(value);
    else if (name === 'event') event = value;
  }
  return event === undefined ? { data: data.join('\n') } : { event, data: data.join('\n') };
}
