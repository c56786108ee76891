import { expect } from 'chai';
import { createFrameInbox } from '../../src/core/frame-inbox.ts';

type Frame = { seq: number; frame: Buffer };
const frames = (from: number, to: number, size = 10): Frame[] =>
  Array.from({ length: to - from + 1 }, (_, i) => ({ seq: from + i, frame: Buffer.alloc(size) }));
const seqs = (taken: readonly Frame[] | null) => taken?.map((f) => f.seq) ?? null;

describe('frame inbox', () => {
  it('answers the frames that continue right after the point, and is empty afterwards', () => {
    const inbox = createFrameInbox<Frame>({ frames: 100, bytes: 1 << 20 });
    inbox.add(frames(1, 3));
    inbox.add(frames(4, 5));
    expect(seqs(inbox.takeAfter(0))).to.deep.equal([1, 2, 3, 4, 5]);
    expect(inbox.takeAfter(5)).to.equal(null);
  });

  it('skips frames already delivered', () => {
    const inbox = createFrameInbox<Frame>({ frames: 100, bytes: 1 << 20 });
    inbox.add(frames(1, 6));
    expect(seqs(inbox.takeAfter(4))).to.deep.equal([5, 6]);
  });

  it('answers null when the next frame is missing, and drops what it held', () => {
    const inbox = createFrameInbox<Frame>({ frames: 100, bytes: 1 << 20 });
    inbox.add(frames(3, 4));
    expect(inbox.takeAfter(1)).to.equal(null, 'frame 2 is not held: the table has it');
    expect(inbox.takeAfter(2)).to.equal(null, 'what was held is gone');
  });

  it('answers the run up to the first gap and drops the rest', () => {
    const inbox = createFrameInbox<Frame>({ frames: 100, bytes: 1 << 20 });
    inbox.add(frames(1, 2));
    inbox.add(frames(5, 6));
    expect(seqs(inbox.takeAfter(0))).to.deep.equal([1, 2]);
    expect(inbox.takeAfter(2)).to.equal(null);
  });

  it('stops collecting at its bound in frames or bytes', () => {
    const byFrames = createFrameInbox<Frame>({ frames: 4, bytes: 1 << 20 });
    byFrames.add(frames(1, 3));
    byFrames.add(frames(4, 6)); // under the bound when added: kept whole
    byFrames.add(frames(7, 8)); // at the bound: dropped
    expect(seqs(byFrames.takeAfter(0))).to.deep.equal([1, 2, 3, 4, 5, 6]);

    const byBytes = createFrameInbox<Frame>({ frames: 100, bytes: 100 });
    byBytes.add(frames(1, 1, 100));
    byBytes.add(frames(2, 2, 1));
    expect(seqs(byBytes.takeAfter(0))).to.deep.equal([1]);
    byBytes.add(frames(2, 2, 1)); // taking emptied it: it collects again
    expect(seqs(byBytes.takeAfter(1))).to.deep.equal([2]);
  });
});
