// Requests node's HTTP parser refuses before any route sees them: a header value holding a
// control character other than tab (0x00-0x08, 0x0A-0x1F, 0x7F), a malformed request line or
// header, headers past node's size limit. The parser stays strict (a lenient one lets a
// request be read two ways, which is how requests are smuggled past a proxy); what changes is
// the answer: SPEC.md's `400 bad_request` envelope naming the problem, instead of node's bare
// `400` with no body.
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
    default:
      return 'The request is not valid HTTP/1.1.';
  }
}

/**
 * Answers what the parser refused in the envelope, on connections that have no answer of
 * their own under way (a keep-alive connection between requests, or a new one); the
 * connection is closed after it, since the parser cannot go on from a malformed request.
 */
export function answerClientErrors(server: http.Server): void {
  const answering = new Map<Socket, number>();
  server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
    const socket = req.socket;
    answering.set(socket, (answering.get(socket) ?? 0) + 1);
    res.once('close', () => {
      const left = (answering.get(socket) ?? 1) - 1;
      if (left > 0) answering.set(socket, left);
      else answering.delete(socket);
    });
  });
  server.on('clientError', (err: ParseError, socket: Socket) => {
    if (err.code === 'ECONNRESET' || !socket.writable || answering.has(socket)) {
      socket.destroy();
      return;
    }
    logger.debug('request refused by the HTTP parser', { code: err.code });
    const body = errorBody('bad_request', describeParseError(err));
    const status = ERROR_CODES.bad_request.status;
    socket.end(
      `HTTP/1.1 ${status} Bad Request\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
      () => socket.destroy(),
    );
  });
}
