// A streaming multipart/form-data reader (RFC 7578), pure: fed the body as it arrives, it answers
// each part's headers and its data in pieces, holding at most one delimiter's length of bytes
// back, so a file of any size passes through in constant memory (docs/api.md "Batches").

export type MultipartEvent =
  | { type: 'part'; name: string; filename: string | null }
  | { type: 'data'; data: Buffer }
  | { type: 'end' };

export class MultipartError extends Error {
  override name = 'MultipartError';
}

/** The boundary of a multipart/form-data content type, or null when it is not one. */
export function multipartBoundary(contentType: string | undefined): string | null {
  if (!contentType || !/^multipart\/form-data\s*;/i.test(contentType)) return null;
  const m = /;\s*boundary=(?:"([^"]{1,70})"|([^\s;]{1,70}))/i.exec(contentType);
  return m ? (m[1] ?? m[2])! : null;
}

const MAX_HEADER_BYTES = 16 * 1024;

export function createMultipartReader(boundary: string): { feed(chunk: Buffer): MultipartEvent[]; finish(): void } {
  const first = Buffer.from(`--${boundary}`);
  const delimiter = Buffer.from(`\r\n--${boundary}`);
  let state: 'preamble' | 'after-boundary' | 'headers' | 'body' | 'done' = 'preamble';
  let buf: Buffer = Buffer.alloc(0);

  const parseHeaders = (text: string): MultipartEvent => {
    const disposition = text.split('\r\n').find((h) => /^content-disposition:/i.test(h));
    if (!disposition) throw new MultipartError('A part has no Content-Disposition.');
    const name = /;\s*name="([^"]*)"/i.exec(disposition)?.[1];
    if (name === undefined) throw new MultipartError('A part has no name.');
    const filename = /;\s*filename="([^"]*)"/i.exec(disposition)?.[1] ?? null;
    return { type: 'part', name, filename };
  };

  return {
    feed(chunk) {
      const events: MultipartEvent[] = [];
      buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk]);
      for (;;) {
        if (state === 'preamble') {
          const at = buf.indexOf(first);
          if (at === -1) {
            buf = buf.subarray(Math.max(0, buf.length - first.length));
            return events;
          }
          buf = buf.subarray(at + first.length);
          state = 'after-boundary';
        } else if (state === 'after-boundary') {
          if (buf.length < 2) return events;
          if (buf[0] === 0x2d && buf[1] === 0x2d) {
            state = 'done';
            events.push({ type: 'end' });
            return events;
          }
          const eol = buf.indexOf('\r\n');
          if (eol === -1) return events;
          buf = buf.subarray(eol + 2);
          state = 'headers';
        } else if (state === 'headers') {
          const end = buf.indexOf('\r\n\r\n');
          if (end === -1) {
            if (buf.length > MAX_HEADER_BYTES) throw new MultipartError('A part\'s headers are too long.');
            return events;
          }
          events.push(parseHeaders(buf.subarray(0, end).toString('utf8')));
          buf = buf.subarray(end + 4);
          state = 'body';
        } else if (state === 'body') {
          const at = buf.indexOf(delimiter);
          if (at === -1) {
            // Everything but what could be the start of the delimiter is data.
            const safe = buf.length - delimiter.length;
            if (safe > 0) {
              events.push({ type: 'data', data: Buffer.from(buf.subarray(0, safe)) });
              buf = buf.subarray(safe);
            }
            return events;
          }
          if (at > 0) events.push({ type: 'data', data: Buffer.from(buf.subarray(0, at)) });
          buf = buf.subarray(at + delimiter.length);
          state = 'after-boundary';
        } else {
          return events;
        }
      }
    },
    finish() {
      if (state !== 'done') throw new MultipartError('The multipart body ended before its closing boundary.');
    },
  };
}
