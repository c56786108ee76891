// OpenAI's Files API for batches (docs/api.md "Batches"): an upload is streamed from the
// multipart body into the database in pieces of 1 MiB, so its size never bounds memory, and is
// kept byte for byte (files.content(input_file_id) answers it as sent). A batch's output and
// error files are built from the lines' stored answers as they are read. Errors are the
// vendor's shape, so its SDK raises its own classes.
import type { Request, Response, Router, RequestHandler } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { createMultipartReader, multipartBoundary, MultipartError } from '../../core/batch-multipart.ts';
import { openaiResultLine, openaiFileOf } from '../../core/batch-shapes.ts';
import { newId } from '../../core/ids.ts';
import { openaiList } from '../../core/vendor-api.ts';
import { withTransaction } from '../../db/pool.ts';
import { startFile, addFilePiece, finishFile, readFilePiece, findFile, listFiles, deleteFile, type FileRow } from '../../db/files.ts';
import { resultPages } from '../../db/batches.ts';
import { serviceAuthOf } from '../service-auth.ts';
import { send } from './streams.ts';
import { vendorRoute, sendJson, limitParam, idParam, orderParam } from './vendor-routes.ts';

const PIECE_BYTES = 1024 * 1024;
const MAX_FIELD_BYTES = 256;

/** A file id of the vendor's form: `file-` and a ULID. */
export const newFileId = (): string => `file-${newId('file').slice('file_'.length)}`;

export function fileObject(f: FileRow) {
  return {
    id: f.id,
    object: 'file',
    bytes: f.bytes,
    created_at: Math.floor(f.created_at.getTime() / 1000),
    filename: f.filename,
    purpose: f.purpose,
    status: 'processed',
    expires_at: null,
    status_details: null,
  };
}

/** POST /files: `purpose` must be `batch`; the file part streams into the database. */
async function upload(deps: Deps, req: Request, res: Response): Promise<void> {
  const auth = serviceAuthOf(res);
  const boundary = multipartBoundary(req.headers['content-type']);
  if (boundary === null) throw new ServiceError('bad_request', 'POST /files takes multipart/form-data with a `file` and `purpose: batch`.');
  const max = deps.settings.current().batch_file_max_bytes;
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > max + 64 * 1024) throw new ServiceError('body_too_large', `The file is larger than ${max} bytes, this deployment's batch_file_max_bytes.`);
  const id = newFileId();
  const file = await withTransaction(deps.pool, async (c) => {
    await startFile(c, { id, tenancyId: auth.tenancyId, namespaceId: auth.namespaceId, filename: '' });
    const reader = createMultipartReader(boundary);
    const fields = new Map<string, string>();
    let part: string | null = null;
    let filename: string | null = null;
    let sawFile = false;
    let seq = 0;
    let bytes = 0;
    let piece: Buffer[] = [];
    let pieceBytes = 0;
    const flush = async () => {
      if (pieceBytes === 0) return;
      await addFilePiece(c, id, seq++, Buffer.concat(piece, pieceBytes));
      piece = [];
      pieceBytes = 0;
    };
    try {
      for await (const chunk of req as AsyncIterable<Buffer>) {
        for (const ev of reader.feed(chunk)) {
          if (ev.type === 'part') {
            part = ev.name;
            if (part === 'file') {
              if (sawFile) throw new ServiceError('bad_request', 'Send one `file` part.');
              sawFile = true;
              filename = ev.filename;
            }
          } else if (ev.type === 'data') {
            if (part === 'file') {
              bytes += ev.data.length;
              if (bytes > max) throw new ServiceError('body_too_large', `The file is larger than ${max} bytes, this deployment's batch_file_max_bytes.`);
              piece.push(ev.data);
              pieceBytes += ev.data.length;
              if (pieceBytes >= PIECE_BYTES) await flush();
            } else if (part !== null) {
              const text = (fields.get(part) ?? '') + ev.data.toString('utf8');
              if (text.length > MAX_FIELD_BYTES) throw new ServiceError('bad_request', `The \`${part.slice(0, 40)}\` field is too long.`);
              fields.set(part, text);
            }
          }
        }
      }
      reader.finish();
    } catch (err) {
      if (err instanceof MultipartError) throw new ServiceError('bad_request', `The multipart body is malformed: ${err.message}`);
      throw err;
    }
    await flush();
    const purpose = fields.get('purpose');
    if (purpose !== 'batch') throw new ServiceError('bad_request', 'Sarsen keeps files for batches only: `purpose` must be `batch`.');
    if (!sawFile) throw new ServiceError('bad_request', 'The body has no `file` part.');
    // Stored as text, which cannot hold U+0000.
    const name = (filename ?? 'upload.jsonl').replaceAll('\u0000', '').slice(0, 255);
    await finishFile(c, id, { purpose, filename: name, bytes });
    return (await findFile(c, auth.namespaceId, id))!;
  });
  sendJson(res, fileObject(file));
}

async function found(deps: Deps, res: Response, id: string): Promise<FileRow> {
  const file = await findFile(deps.pool, serviceAuthOf(res).namespaceId, id);
  if (!file) throw new ServiceError('not_found', `No file with id ${JSON.stringify(id.slice(0, 100))} in this namespace.`);
  return file;
}

async function retrieve(deps: Deps, req: Request, res: Response): Promise<void> {
  sendJson(res, fileObject(await found(deps, res, String(req.params.id))));
}

async function list(deps: Deps, req: Request, res: Response): Promise<void> {
  const limit = limitParam(req, 10_000, 10_000);
  const purpose = idParam(req, 'purpose');
  const rows = await listFiles(deps.pool, serviceAuthOf(res).namespaceId, { after: idParam(req, 'after'), limit: limit + 1, order: orderParam(req), purpose });
  sendJson(res, openaiList(rows, limit, fileObject));
}

/** An input file's bytes as uploaded; an output or error file's lines, built from the lines and their stored answers. */
async function content(deps: Deps, req: Request, res: Response): Promise<void> {
  const file = await found(deps, res, String(req.params.id));
  res.status(200).set('content-type', 'application/octet-stream');
  if (file.batch_id === null) {
    res.set('content-length', String(file.bytes));
    for (let seq = 0; ; seq++) {
      const piece = await readFilePiece(deps.pool, file.id, seq);
      if (piece === null) break;
      await send(res, piece);
    }
  } else {
    for await (const page of resultPages(deps.pool, file.batch_id)) {
      const text = page.filter((l) => openaiFileOf(l) === file.kind).map((l) => openaiResultLine(file.batch_id!, l)).join('');
      if (text.length > 0) await send(res, text);
    }
  }
  res.end();
}

async function remove(deps: Deps, req: Request, res: Response): Promise<void> {
  const file = await found(deps, res, String(req.params.id));
  await deleteFile(deps.pool, serviceAuthOf(res).namespaceId, file.id);
  sendJson(res, { id: file.id, object: 'file', deleted: true });
}

export function fileRoutes(deps: Deps, router: Router, base: string, use: RequestHandler): void {
  router.post(`${base}/files`, use, vendorRoute(deps, upload));
  router.get(`${base}/files`, use, vendorRoute(deps, list));
  router.get(`${base}/files/:id`, use, vendorRoute(deps, retrieve));
  router.get(`${base}/files/:id/content`, use, vendorRoute(deps, content));
  router.delete(`${base}/files/:id`, use, vendorRoute(deps, remove));
}
