// Request bodies. Submission bodies are read as raw bytes (the canonical form is built from
// them, never from a re-serialised object) with the 2 MiB limit enforced while reading, so a
// larger body costs no more memory than the limit.
import type { Request } from 'express';
import { ServiceError } from '../core/errors.ts';

/** docs/api.md "Limits": fixed at build time, not a deployment figure. */
export const MAX_SUBMISSION_BYTES = 2 * 1024 * 1024;
/** Administration payloads are small documents. */
export const MAX_ADMIN_BYTES = 64 * 1024;

const TOO_LARGE = Symbol('sarsen.bodyTooLarge');

export function isJsonContentType(value: string | undefined): boolean {
  if (!value) return false;
  const type = value.split(';', 1)[0]!.trim().toLowerCase();
  return type === 'application/json';
}

/** Whether the response must close the connection: the client may still be sending a body we refused. */
export function bodyWasAbandoned(req: Request): boolean {
  return (req as unknown as Record<symbol, unknown>)[TOO_LARGE] === true;
}

function tooLarge(req: Request, limit: number): ServiceError {
  (req as unknown as Record<symbol, unknown>)[TOO_LARGE] = true;
  req.pause(); // read no further: the kernel's buffers, not ours, hold what the client keeps sending
  return new ServiceError('body_too_large', `The body is larger than ${limit} bytes.`);
}

/** Reads the whole body as bytes, refusing a wrong media type (415) or more than `limit` bytes (413). */
export async function readBody(req: Request, limit: number): Promise<Buffer> {
  if (!isJsonContentType(req.headers['content-type'])) throw new ServiceError('unsupported_media_type');
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > limit) throw tooLarge(req, limit);
  const chunks: Buffer[] = [];
  let size = 0;
  return new Promise<Buffer>((resolve, reject) => {
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        cleanup();
        chunks.length = 0;
        reject(tooLarge(req, limit));
        return;
      }
      chunks.push(chunk);
    };
    const onEnd = () => {
      cleanup();
      resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size));
    };
    const onError = (err: Error) => {
      cleanup();
      reject(err);
    };
    const cleanup = () => {
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('error', onError);
      req.off('aborted', onAborted);
    };
    const onAborted = () => onError(new ClientAborted());
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onError);
    req.on('aborted', onAborted);
  });
}

/** The client gave up before its body arrived: nothing to answer, and not a fault of ours. */
export class ClientAborted extends Error {
  constructor() {
    super('client aborted the request body');
    this.name = 'ClientAborted';
  }
}

const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** Decodes a body as strict UTF-8 (RFC 8259 §8.1); invalid sequences are a 400. */
export function decodeUtf8(bytes: Buffer): string {
  try {
    return utf8.decode(bytes);
  } catch {
    throw new ServiceError('bad_request', 'The body is not valid UTF-8.');
  }
}

/** For administration routes: a small JSON document parsed with JSON.parse. */
export async function readJsonDocument(req: Request): Promise<unknown> {
  const text = decodeUtf8(await readBody(req, MAX_ADMIN_BYTES));
  try {
    return JSON.parse(text);
  } catch {
    throw new ServiceError('bad_request', 'The body is not valid JSON.');
  }
}
