// Requests node's HTTP parser refuses: before any route sees them (a header value holding a
// control character other than tab (0x00-0x08, 0x0A-0x1F, 0x7F), a malformed request line or
// header, headers past node's size limit), or in the middle of a chunked body a route is
// reading (a chunk size that is not hexadecimal or overflows, a malformed chunk extension, chunk
// data longer or shorter than its size, a connection ended inside the body). The parser stays
// strict (a lenient one lets a request be read two ways, which is how requests are smuggled
// past a proxy); what changes is the answer: the `400 bad_request` envelope naming the problem,
// instead of node's bare `400` with no body, or none at all.
import type http from 'node:http';
import type { Socket } from 'node:net';
import { ERROR_CODES, errorBody } from '../core/errors.ts';
import { logger } from '../log.ts';

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,64}$/;

/** The name of the header whose value the parser stopped in, when the packet shows it. */
function headerAt(packet: Buffer | undefined, offset: number | undefined): string | null {
  if (!packet || offset === undefined || offset > packet.length) return null;
  const lineStart = packet.lastIndexOf(0x0a, offset - 1) + 1;
  const colon = packet.indexOf(0x3a, lineStart);
  if (lineStart === 0 || colon < 0 || colon >= offset) return null;
  const name = packet.subarray(lineStart, colon).toString('latin1');
  return TOKEN.test(name) ? name.toLowerCase() : null;
}

type ParseError = Error & { code?: string; reason?: string; rawPacket?: Buffer; bytesParsed?: number };

/** What a caller is told, by the parser's error code; never an echo of the value itself. */
export function describeParseError(err: ParseError): string {
  switch (err.code) {
    case 'HPE_INVALID_HEADER_TOKEN': {
      if (err.reason !== 'Invalid header value char') return 'A request header name holds a character a header name may not hold.';
      const name = headerAt(err.rawPacket, err.bytesParsed);
      const which = name === null ? 'A request header' : `The request header \`${name}\``;
      return `${which} holds a control character in its value; header values may hold no control character other than tab.`;
    }
    case 'HPE_HEADER_OVERFLOW':
      return 'The request headers are larger than this server accepts.';
    case 'HPE_INVALID_URL':
      return 'The request path holds a character a URL may not hold.';
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return 'The request was not received in time.';
    case 'HPE_LF_EXPECTED':
    case 'HPE_CR_EXPECTED':
      return 'A request header line is not ended by CRLF (a bare CR is a control character).';
    case 'HPE_INVALID_CHUNK_SIZE':
      return /overflow/i.test(err.reason ?? '')
        ? 'A chunk size in the request body is larger than this server accepts.'
        : 'A chunk size in the request body is not a hexadecimal number.';
    case 'HPE_INVALID_EOF_STATE':
      return 'The connection ended before the request was complete.';
    case 'HPE_STRICT':
      if (/chunk extension/i.test(err.reason ?? '')) return 'A chunk extension in the request body holds a character it may not hold.';
      if (/chunk data/i.test(err.reason ?? '')) return 'A chunk of the request body is not followed by CRLF where its size says it ends.';
      return 'The request is not valid HTTP/1.1.';
    default:
      return 'The request is not valid HTTP/1.1.';
  }
}

type Exchange = { req: http.IncomingMessage; res: http.ServerResponse };

/**
 * Answers what the parser refused in the envelope, unless an answer is already under way for
 * the request it refused (a route that answered before reading the body), and after the answers
 * to earlier requests on the connection (pipelined) are written; the connection is closed after
 * it, since the parser cannot go on from a malformed request.
 */
export function answerClientErrors(server: http.Server): void {
  // The requests of each connection whose answer is not yet written, or whose body is not yet read.
  const exchanges = new Map<Socket, Exchange[]>();
  const watched = new WeakSet<Socket>();
  server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
    const socket = req.socket;
    const ex = { req, res };
    const open = exchanges.get(socket);
    if (open) open.push(ex);
    else exchanges.set(socket, [ex]);
    if (!watched.has(socket)) {
      watched.add(socket);
      socket.once('close', () => exchanges.delete(socket));
    }
    // Forgotten once answered and its body read (or dropped by node after the answer): an
    // answer given before the body was read still owns the rest of that body.
    let pending = 2;
    const settled = () => {
      if (--pending > 0) return;
      const left = exchanges.get(socket)?.filter((e) => e !== ex) ?? [];
      if (left.length > 0) exchanges.set(socket, left);
      else exchanges.delete(socket);
    };
    res.once('close', settled);
    req.once('close', settled);
  });
  server.on('clientError', (err: ParseError, socket: Socket) => {
    const open = exchanges.get(socket) ?? [];
    // The parser stopped in the body of the request still being read, or in the head of a new one.
    const refused = open.find((e) => !e.req.complete);
    if (err.code === 'ECONNRESET' || !socket.writable || refused?.res.headersSent) {
      socket.destroy();
      return;
    }
    logger.debug('request refused by the HTTP parser', { code: err.code });
    const body = errorBody('bad_request', describeParseError(err));
    const status = ERROR_CODES.bad_request.status;
    const answer = () => {
      if (!socket.writable || refused?.res.headersSent) return void socket.destroy();
      socket.end(
        `HTTP/1.1 ${status} Bad Request\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
        () => socket.destroy(),
      );
    };
    const earlier = open.filter((e) => e !== refused && !e.res.closed);
    if (earlier.length === 0) return answer();
    void Promise.all(earlier.map((e) => new Promise((resolve) => e.res.once('close', resolve)))).then(answer);
  });
}
