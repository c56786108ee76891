import { expect } from 'chai';
import { createFrameEncoder, decodeFrame, deltaFrame, keyframeAtOrBefore, wholeFrame, KEYFRAME_EVERY } from '../../src/core/frame-delta.ts';
import { prng } from '../support/prng.ts';


const latin1 = (b: Buffer) => b.toString('latin1');

/** Encodes a stream's frames as the executor does, decodes them as a reader does from the first, and answers the stored sizes. */
function roundTrip(frames: Buffer[], firstSeq = 1): number[] {
  const encode = createFrameEncoder();
  const stored = frames.map((f, i) => encode(firstSeq + i, f));
  let ref: string | null = null;
  stored.forEach((s, i) => {
    if (!frames[i]!.includes(0)) expect(s.includes(0), 'a stored frame holds no NUL byte when its frame holds none').to.equal(false);
    const decoded = decodeFrame(latin1(s), ref);
    expect(decoded, `frame ${i}`).to.equal(latin1(frames[i]!));
    ref = decoded;
  });
  return stored.map((s) => s.length);
}

const chunk = (content: string, obfuscation: string) =>
  Buffer.from(
    `data: {"id":"chatcmpl-CBx9ZkT2hKfJ3qP1sWmA0","object":"chat.completion.chunk","created":1764763200,"model":"gpt-4o-2024-08-06",` +
      `"choices":[{"index":0,"delta":{"content":${JSON.stringify(content)}},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"${obfuscation}"}\n\n`,
  );

describe('frame-delta', () => {
  it('stores a provider stream\'s frames as a small part of their bytes, and decodes them exactly', () => {
    const words = [' the', ' quick', ' Über', ' naïve', ' 😀', ' "quoted"', '\\n', ' a\u0000b'];
    const frames = Array.from({ length: 100 }, (_, i) => chunk(words[i % words.length]!, `x${(i * 7919).toString(36)}`));
    const sizes = roundTrip(frames);
    const stored = sizes.reduce((a, b) => a + b, 0);
    const raw = frames.reduce((a, f) => a + f.length, 0);
    expect(stored).to.be.below(raw / 5);
  });

  it('stores the first frame, every KEYFRAME_EVERY-th and one after a gap whole', () => {
    const encode = createFrameEncoder();
    const f = (i: number) => chunk(`w${i}`, 'o');
    const marker = (seq: number) => String.fromCharCode(encode(seq, f(seq))[0]!);
    expect(marker(30)).to.equal('K'); // the first
    expect(marker(31)).to.equal('D');
    expect(marker(32)).to.equal('K'); // a multiple of KEYFRAME_EVERY
    expect(marker(33)).to.equal('D');
    expect(marker(35)).to.equal('K'); // not the one after the frame before
    expect(KEYFRAME_EVERY).to.equal(32);
  });

  it('finds the whole frame a reader starts from', () => {
    expect(keyframeAtOrBefore(0)).to.equal(0);
    expect(keyframeAtOrBefore(1)).to.equal(0);
    expect(keyframeAtOrBefore(31)).to.equal(0);
    expect(keyframeAtOrBefore(32)).to.equal(32);
    expect(keyframeAtOrBefore(70)).to.equal(64);
  });

  it('stores whole what a difference would not make smaller', () => {
    expect(deltaFrame(Buffer.from('event: a\n\n'), Buffer.from('data: {"b":2}\r\n\r\n'))).to.equal(null);
    // The same frame again is a copy of all of it: three bytes and the marker.
    expect(deltaFrame(Buffer.from('data: 1\n\n'), Buffer.from('data: 1\n\n'))).to.have.length(4);
    const encode = createFrameEncoder();
    encode(1, Buffer.from('data: abcdefgh\n\n'));
    const other = Buffer.from('event: zzz\n\n');
    expect(encode(2, other)).to.deep.equal(wholeFrame(other));
  });

  it('answers null for a difference without the frame before it', () => {
    const encode = createFrameEncoder();
    encode(1, chunk('a', 'o'));
    const delta = encode(2, chunk('b', 'o'));
    expect(decodeFrame(latin1(delta), null)).to.equal(null);
    expect(decodeFrame(latin1(wholeFrame(chunk('b', 'o'))), null)).to.equal(latin1(chunk('b', 'o')));
  });

  it('decodes random frames and random changes between them exactly', () => {
    const rnd = prng(62);
    for (let run = 0; run < 200; run++) {
      const alphabet = run % 2 === 0 ? 'ab{}":,' : 'abcdefghijklmnopqrstuvwxyz0123456789 {}":,\n\u00e9\u{1f600}\u0000\u00ff';
      const pick = () => alphabet[Math.floor(rnd() * alphabet.length)]!;
      let text = Array.from({ length: 1 + Math.floor(rnd() * 600) }, pick).join('');
      const frames: Buffer[] = [];
      for (let i = 0; i < 40; i++) {
        // Insert, delete or replace a few runs, as a provider's next frame does.
        for (let edits = Math.floor(rnd() * 4); edits > 0; edits--) {
          const at = Math.floor(rnd() * text.length);
          const cut = Math.floor(rnd() * 20);
          text = text.slice(0, at) + Array.from({ length: Math.floor(rnd() * 20) }, pick).join('') + text.slice(at + cut);
        }
        if (text.length === 0) text = pick();
        frames.push(Buffer.from(text));
      }
      roundTrip(frames, 1 + Math.floor(rnd() * 100));
    }
  });

  it('handles frames of many kilobytes', () => {
    const big = Buffer.from(`data: ${'x'.repeat(70_000)}\n\n`);
    const next = Buffer.from(`data: ${'x'.repeat(69_000)}y${'x'.repeat(1_000)}\n\n`);
    const sizes = roundTrip([big, next, big]);
    expect(sizes[1]).to.be.below(30);
  });
});
