import { expect } from 'chai';
import { createFramer, frameEvent } from '../../src/core/sse-framer.ts';
import { prng } from '../support/prng.ts';

const b = (s: string): Buffer => Buffer.from(s, 'utf8');
const strs = (frames: Buffer[]): string[] => frames.map((f) => f.toString('utf8'));

/** Pushes each piece in turn, then ends; returns every frame as text, plus the end() part separately. */
function run(pieces: (string | Buffer)[]): { frames: string[]; rest: string[] } {
  const framer = createFramer();
  const frames: string[] = [];
  for (const p of pieces) frames.push(...strs(framer.push(typeof p === 'string' ? b(p) : p)));
  return { frames, rest: strs(framer.end()) };
}


describe('sse-framer', () => {
  describe('createFramer', () => {
    it('splits LF-terminated frames', () => {
      const r = run(['data: {"a":1}\n\ndata: {"b":2}\n\n']);
      expect(r.frames).to.deep.equal(['data: {"a":1}\n\n', 'data: {"b":2}\n\n']);
      expect(r.rest).to.deep.equal([]);
    });

    it('splits CRLF-terminated frames', () => {
      const r = run(['event: ping\r\ndata: {}\r\n\r\nevent: x\r\ndata: 1\r\n\r\n']);
      expect(r.frames).to.deep.equal(['event: ping\r\ndata: {}\r\n\r\n', 'event: x\r\ndata: 1\r\n\r\n']);
      expect(r.rest).to.deep.equal([]);
    });

    it('splits CR-terminated frames, holding the last one until the next byte or end', () => {
      const framer = createFramer();
      expect(strs(framer.push(b('data: 1\r\rdata: 2\r\r')))).to.deep.equal(['data: 1\r\r']);
      expect(strs(framer.end())).to.deep.equal(['data: 2\r\r']);
    });

    it('releases a CR-ended frame as soon as a byte other than LF arrives', () => {
      const framer = createFramer();
      expect(framer.push(b('data: 1\r\r'))).to.deep.equal([]);
      expect(strs(framer.push(b('d')))).to.deep.equal(['data: 1\r\r']);
      expect(strs(framer.end())).to.deep.equal(['d']);
    });

    it('handles mixed line endings within and between frames', () => {
      const r = run(['event: a\rdata: 1\r\n\ndata: 2\n\r\n: c\r\ndata: 3\r\r']);
      expect(r.frames).to.deep.equal(['event: a\rdata: 1\r\n\n', 'data: 2\n\r\n']);
      // The last frame's blank line ends in CR, so only end() can release it.
      expect(r.rest).to.deep.equal([': c\r\ndata: 3\r\r']);
    });

    it('treats CR at the end of one push and LF at the start of the next as one line ending', () => {
      // Line ending split: "data: 1\r" | "\n\n" is data line + blank line, one frame.
      expect(run(['data: 1\r', '\n\n', 'data: 2\n\n']).frames).to.deep.equal(['data: 1\r\n\n', 'data: 2\n\n']);
      // Blank-line ending split: "data: 1\r\n\r" | "\ndata: 2..." keeps the LF in the first frame.
      expect(run(['data: 1\r\n\r', '\ndata: 2\r\n\r', '\n']).frames).to.deep.equal([
        'data: 1\r\n\r\n',
        'data: 2\r\n\r\n',
      ]);
    });

    it('does not mistake CR then LF for a blank line', () => {
      const r = run(['data: 1\r', '\n', 'data: 2\r\n', '\r\n']);
      expect(r.frames).to.deep.equal(['data: 1\r\ndata: 2\r\n\r\n']);
      expect(r.rest).to.deep.equal([]);
    });

    it('keeps comments, multi-line data, event and id lines as bytes of the frame', () => {
      const stream = ': ping\n\nid: 7\nevent: message_delta\ndata: {"a":\ndata: 1}\nretry: 10\n\n';
      expect(run([stream]).frames).to.deep.equal([': ping\n\n', 'id: 7\nevent: message_delta\ndata: {"a":\ndata: 1}\nretry: 10\n\n']);
    });

    it('returns a final frame without its blank line from end()', () => {
      const r = run(['data: 1\n\ndata: 2\n']);
      expect(r.frames).to.deep.equal(['data: 1\n\n']);
      expect(r.rest).to.deep.equal(['data: 2\n']);
      expect(run(['data: [DONE]']).rest).to.deep.equal(['data: [DONE]']);
    });

    it('accepts empty pushes anywhere, including between CR and LF', () => {
      const r = run(['', 'data: 1\r', '', '', '\n\r', '', '\n', '']);
      expect(r.frames).to.deep.equal(['data: 1\r\n\r\n']);
      expect(r.rest).to.deep.equal([]);
      expect(run([]).rest).to.deep.equal([]);
    });

    it('makes each surplus blank line a frame of its own', () => {
      expect(run(['\ndata: 1\n\n\n\r\n']).frames).to.deep.equal(['\n', 'data: 1\n\n', '\n', '\r\n']);
    });

    it('passes multibyte UTF-8 split across pushes through unchanged', () => {
      const whole = b('data: "héllo 日本 😀"\n\n');
      const pieces = [...whole].map((byte) => Buffer.from([byte]));
      const framer = createFramer();
      const frames = pieces.flatMap((p) => framer.push(p));
      expect(frames).to.have.length(1);
      expect(frames[0].equals(whole)).to.equal(true);
    });

    it('does not alias the pushed buffers', () => {
      const framer = createFramer();
      const chunk = b('data: 1\n\ndata: 2');
      const [frame] = framer.push(chunk);
      chunk.fill(0x78);
      expect(frame.toString()).to.equal('data: 1\n\n');
      expect(strs(framer.end())).to.deep.equal(['data: 2']);
    });

    it('can be reused after end()', () => {
      const framer = createFramer();
      framer.push(b('data: 1\r\r'));
      expect(strs(framer.end())).to.deep.equal(['data: 1\r\r']);
      // The held CR must not swallow a leading LF of the next stream.
      expect(strs(framer.push(b('\n')))).to.deep.equal(['\n']);
    });

    it('stays linear when one large frame arrives in many small reads', function () {
      this.timeout(30000);
      const line = `data: ${'x'.repeat(1000)}\n`;
      const big = Buffer.from(line.repeat(8 * 1024) + '\n'); // ~8 MB, one frame
      const framer = createFramer();
      const frames: Buffer[] = [];
      for (let i = 0; i < big.length; i += 64) frames.push(...framer.push(big.subarray(i, i + 64)));
      expect(frames).to.have.length(1);
      expect(frames[0].equals(big)).to.equal(true);
      expect(framer.end()).to.deep.equal([]);
    });
  });

  describe('fuzz', () => {
    const texts = ['hello', 'héllo wörld', '日本語のテキスト', 'emoji 😀🎉', 'Ωμέγα', 'tab\there', 'quote \\" end', ''];
    const endings = ['\n', '\r\n', '\r'];

    /** A random realistic stream plus the frames it was built from. */
    function makeStream(rand: () => number): { stream: Buffer; frames: Buffer[] } {
      const pick = <T>(xs: T[]): T => xs[Math.floor(rand() * xs.length)];
      const frames: string[] = [];
      let prevEnding = '';
      // A blank line ended by LF right after a bare CR would read as CRLF: the
      // generator avoids that, since it would not be the structure it claims.
      const ending = (blank: boolean): string => {
        const choices = blank && prevEnding === '\r' ? ['\r', '\r\n'] : endings;
        return (prevEnding = pick(choices));
      };
      const line = (s: string): string => s + ending(false);
      const chat = rand() < 0.5;
      const count = 1 + Math.floor(rand() * 12);
      for (let e = 0; e < count; e++) {
        let f = '';
        if (rand() < 0.1) f += line(': ping');
        if (rand() < 0.1) {
          frames.push(f + ending(true));
          continue;
        }
        if (!chat) f += line(`event: ${pick(['message_start', 'content_block_delta', 'message_delta', 'ping'])}`);
        if (rand() < 0.2) f += line(`id: ${e}`);
        const payload = JSON.stringify({ type: 'delta', text: pick(texts), n: e });
        if (rand() < 0.2) {
          const cut = Math.floor(rand() * payload.length);
          f += line(`data: ${payload.slice(0, cut)}`) + line(`data:${payload.slice(cut)}`);
        } else {
          f += line(`data: ${payload}`);
        }
        frames.push(f + ending(true));
        if (rand() < 0.05) frames.push(ending(true)); // surplus blank line
      }
      if (chat && rand() < 0.8) frames.push(line('data: [DONE]') + ending(true));
      if (rand() < 0.2) frames.push(rand() < 0.5 ? line('data: {"tail":true}') : 'data: no ending');
      const bufs = frames.map((s) => Buffer.from(s, 'utf8'));
      return { stream: Buffer.concat(bufs), frames: bufs };
    }

    function framesOf(stream: Buffer, cuts: number[]): Buffer[] {
      const framer = createFramer();
      const out: Buffer[] = [];
      let from = 0;
      for (const cut of [...cuts, stream.length]) {
        out.push(...framer.push(stream.subarray(from, cut)));
        from = cut;
      }
      out.push(...framer.end());
      return out;
    }

    it('frames random streams split at random byte positions exactly as generated', () => {
      for (let run = 0; run < 4000; run++) {
        const seed = 0x5eed + run;
        const rand = prng(seed);
        const { stream, frames: expected } = makeStream(rand);
        const cuts: number[] = [];
        for (let p = 0; p < stream.length; ) {
          // Mostly small reads, sometimes empty, sometimes large.
          const r = rand();
          p += r < 0.1 ? 0 : r < 0.8 ? 1 + Math.floor(rand() * 8) : Math.floor(rand() * 200);
          if (p < stream.length) cuts.push(p);
        }
        const split = framesOf(stream, cuts);
        const whole = framesOf(stream, []);
        const hex = (fs: Buffer[]): string[] => fs.map((f) => f.toString('hex'));
        expect(Buffer.concat(split).equals(stream), `seed ${seed}: concatenation`).to.equal(true);
        expect(hex(split), `seed ${seed}: split vs whole`).to.deep.equal(hex(whole));
        expect(hex(whole), `seed ${seed}: whole vs generated`).to.deep.equal(hex(expected));
      }
    });
  });

  describe('frameEvent', () => {
    it('reads the event name and joined data lines', () => {
      expect(frameEvent(b('event: message_delta\r\ndata: {"a":\r\ndata:1}\r\n\r\n'))).to.deep.equal({
        event: 'message_delta',
        data: '{"a":\n1}',
      });
    });

    it('ignores comments, id and retry lines and has no event when none was named', () => {
      expect(frameEvent(b(': ping\nid: 4\nretry: 9\ndata: x\n\n'))).to.deep.equal({ data: 'x' });
    });

    it('removes one leading space only, and treats a bare field name as empty', () => {
      expect(frameEvent(b('data:  two\ndata\ndata:x\r\r')).data).to.equal(' two\n\nx');
    });

    it('reads a comment-only or blank frame as empty data', () => {
      expect(frameEvent(b(': keepalive\n\n'))).to.deep.equal({ data: '' });
      expect(frameEvent(b('\n'))).to.deep.equal({ data: '' });
    });

    it('decodes UTF-8 and skips a leading byte-order mark', () => {
      expect(frameEvent(Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), b('data: 日本\n\n')]))).to.deep.equal({ data: '日本' });
    });
  });
});
