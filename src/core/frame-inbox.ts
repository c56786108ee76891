// Frames a reader was handed in memory and has not delivered yet (a watch's inbox). It is
// bounded: a reader that fell behind stops collecting and reads the table instead, so its
// memory stays within the bound whatever the stream's length.

export type InboxFrame = Readonly<{ seq: number; frame: { readonly length: number } }>;

export type FrameInbox<F extends InboxFrame> = {
  /** Keeps `frames` (consecutive, in order) unless the inbox is already at its bound. */
  add(frames: readonly F[]): void;
  /**
   * Empties the inbox and answers its frames that continue exactly after `after`, up to the
   * first gap; null when it holds no such frame (the caller reads the table instead). What
   * follows a gap is dropped: the table has it, and it is read next time round.
   */
  takeAfter(after: number): F[] | null;
};

export function createFrameInbox<F extends InboxFrame>(bounds: Readonly<{ frames: number; bytes: number }>): FrameInbox<F> {
  let held: F[] = [];
  let bytes = 0;
  return {
    add(frames) {
      if (held.length >= bounds.frames || bytes >= bounds.bytes) return;
      held.push(...frames);
      for (const f of frames) bytes += f.frame.length;
    },
    takeAfter(after) {
      if (held.length === 0) return null;
      const taken = held;
      held = [];
      bytes = 0;
      let from = 0;
      while (from < taken.length && taken[from]!.seq <= after) from++;
      if (from === taken.length || taken[from]!.seq !== after + 1) return null;
      let to = from + 1;
      while (to < taken.length && taken[to]!.seq === taken[to - 1]!.seq + 1) to++;
      return from === 0 && to === taken.length ? taken : taken.slice(from, to);
    },
  };
}
