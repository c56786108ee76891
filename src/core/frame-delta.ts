// How a stream frame is stored (docs/storage.md "How frames are stored"): whole, or as the
// difference from the frame before it in the same attempt. A provider's frames repeat each other
// all but a few bytes (the id, the model, the envelope, the field names), so a difference holds
// what changed: a chat.completion.chunk of 190 bytes is stored in about 15.
//
// A stored frame starts with a marker byte:
// - `K`: the frame follows, whole;
// - `D`: the frame is made from the one before it (sequence number minus one, same attempt) by
//   steps of [literal length, literal bytes, copy position, copy length], each number a varint of
//   itself plus one (so a stored frame holds no zero byte and reads back as text; see selectBytes).
// Frames whose sequence number is a multiple of KEYFRAME_EVERY are stored whole, as is the first
// of each attempt, so a reader that starts anywhere reads at most KEYFRAME_EVERY - 1 frames more.

/** Every frame whose sequence number is a multiple of this is stored whole (a stored format: never change it). */
export const KEYFRAME_EVERY = 32;

const WHOLE = 0x4b; // 'K'
const DELTA = 0x44; // 'D'

/** The sequence number at or before `seq` from which a reader can decode `seq` (a whole frame, if the attempt has one there). */
export const keyframeAtOrBefore = (seq: number): number => seq - (((seq % KEYFRAME_EVERY) + KEYFRAME_EVERY) % KEYFRAME_EVERY);

/** A frame stored whole. */
export function wholeFrame(frame: Buffer): Buffer {
  const out = Buffer.allocUnsafe(frame.length + 1);
  out[0] = WHOLE;
  frame.copy(out, 1);
  return out;
}

// Match finding: the reference's 4-byte sequences by a 10-bit hash, the first position of each.
const HASH_BITS = 10;
const heads = new Int32Array(1 << HASH_BITS);
const MIN_MATCH = 4;
const hashAt = (b: Buffer, i: number): number =>
  (Math.imul(b[i]! | (b[i + 1]! << 8) | (b[i + 2]! << 16) | (b[i + 3]! << 24), 0x9e3779b1) >>> (32 - HASH_BITS));

let scratch = Buffer.allocUnsafe(4096);

function putVarint(at: number, value: number): number {
  let v = value + 1;
  while (v >= 0x80) {
    scratch[at++] = (v & 0x7f) | 0x80;
    v = Math.floor(v / 128);
  }
  scratch[at++] = v;
  return at;
}

/**
 * `frame` as the difference from `ref`, or null when that would not be shorter than storing it
 * whole. The bytes both begin and end with are copied as they are; between them, greedily, each
 * position of the frame takes the longest run of the reference's middle found by the hash of its
 * first four bytes, extended backwards over the literal before it.
 */
export function deltaFrame(frame: Buffer, ref: Buffer): Buffer | null {
  const limit = frame.length; // a difference longer than the frame itself is not worth storing
  if (scratch.length < 2 * limit + 16) scratch = Buffer.allocUnsafe(2 * limit + 16);
  const shorter = Math.min(frame.length, ref.length);
  let head = 0;
  while (head < shorter && frame[head] === ref[head]) head++;
  let tail = 0;
  while (tail < shorter - head && frame[frame.length - 1 - tail] === ref[ref.length - 1 - tail]) tail++;
  const end = frame.length - tail; // the frame's middle is [head, end), the reference's [head, refEnd)
  const refEnd = ref.length - tail;
  let out = 0;
  scratch[out++] = DELTA;
  let literal = head; // where the pending literal starts
  if (head > 0) out = step(out, frame, 0, 0, 0, head);
  if (end - head >= MIN_MATCH && refEnd - head >= MIN_MATCH) {
    heads.fill(-1);
    for (let j = refEnd - MIN_MATCH; j >= head; j--) heads[hashAt(ref, j)] = j; // ends holding the first position
    let i = head;
    while (i + MIN_MATCH <= end) {
      let j = heads[hashAt(frame, i)]!;
      if (j < 0 || frame[i] !== ref[j] || frame[i + 1] !== ref[j + 1] || frame[i + 2] !== ref[j + 2] || frame[i + 3] !== ref[j + 3]) {
        i++;
        continue;
      }
      let length = MIN_MATCH;
      while (i + length < end && j + length < refEnd && frame[i + length] === ref[j + length]) length++;
      while (i > literal && j > head && frame[i - 1] === ref[j - 1]) {
        i--;
        j--;
        length++;
      }
      out = step(out, frame, literal, i, j, length);
      if (out > limit) return null;
      i += length;
      literal = i;
    }
  }
  if (literal < end || tail > 0 || out === 1) out = step(out, frame, literal, end, refEnd, tail);
  if (out > limit) return null;
  const delta = Buffer.allocUnsafe(out);
  scratch.copy(delta, 0, 0, out);
  return delta;
}

function step(out: number, frame: Buffer, from: number, to: number, copyAt: number, copyLength: number): number {
  out = putVarint(out, to - from);
  frame.copy(scratch, out, from, to);
  out += to - from;
  out = putVarint(out, copyAt);
  return putVarint(out, copyLength);
}

/**
 * The encoder of one attempt's frames, handed them in order: each is stored whole or as its
 * difference from the frame before it.
 */
export function createFrameEncoder(): (seq: number, frame: Buffer) => Buffer {
  let lastSeq = -1;
  let last: Buffer | null = null;
  return (seq, frame) => {
    const ref = last !== null && lastSeq === seq - 1 && seq % KEYFRAME_EVERY !== 0 ? last : null;
    lastSeq = seq;
    last = frame;
    return (ref && deltaFrame(frame, ref)) ?? wholeFrame(frame);
  };
}

/** A decoded frame: its bytes as a latin1 string (one character a byte). */
export type Decoded = { seq: number; attempt: number; frame: string };

function readVarint(s: string, at: number): [value: number, at: number] {
  let value = 0;
  let scale = 1;
  for (;;) {
    const b = s.charCodeAt(at++);
    value += (b & 0x7f) * scale;
    if (b < 0x80) return [value - 1, at];
    scale *= 128;
  }
}

/**
 * The frame stored as `stored` (a latin1 string), given the frame before it in its attempt
 * (`ref`, null when there is none at hand); null when it is a difference and `ref` is null (a
 * reader that needs it must start at a whole frame: keyframeAtOrBefore).
 */
export function decodeFrame(stored: string, ref: string | null): string | null {
  const marker = stored.charCodeAt(0);
  if (marker === WHOLE) return stored.slice(1);
  if (marker !== DELTA) throw new Error('a stored frame with an unknown marker');
  if (ref === null) return null;
  let frame = '';
  let at = 1;
  while (at < stored.length) {
    let n: number;
    [n, at] = readVarint(stored, at);
    frame += stored.slice(at, at + n);
    at += n;
    let copyAt: number;
    [copyAt, at] = readVarint(stored, at);
    [n, at] = readVarint(stored, at);
    frame += ref.slice(copyAt, copyAt + n);
  }
  return frame;
}
