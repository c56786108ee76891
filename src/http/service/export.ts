// GET .../requests/export (key with the manage grant; docs/storage.md): a namespace's records as
// NDJSON, oldest first, one line each: the listing row, and with `with_payloads=true` the
// request body (its exact text, as a JSON string), the answer and a stream's frames back to
// back (their exact bytes, base64). Written a page at a time as the caller reads (back-pressure),
// so a slow reader holds a page, not the export; `after=<request id>` continues where an export
// stopped. `sarsen export` (src/cli/export.ts) is its client.
import type { Request, Response, Router } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { isId } from '../../core/ids.ts';
import { parseInstant } from '../../core/listing-filter.ts';
import { exportPage, payloads, answerSlice, frameRows, type ExportRow, type StoredPayload } from '../../db/export.ts';
import { createFrameReader, frameBytes, type FrameReader } from '../../db/chunks.ts';
import { listingRow, type NamespaceScope } from './accounts.ts';
import { send } from './streams.ts';

const PAGE = 200;
// Records are read together while their payloads add up to this; a larger one is read alone, in pieces.
const GROUP_BYTES = 4 * 1024 * 1024;
const INLINE_ANSWER = 1024 * 1024;
const SLICE = 3 * 256 * 1024; // a multiple of 3: base64 pieces join into one
const FRAME_ROWS = 256;

function param(req: Request, name: string): string | undefined {
  const v = req.query[name];
  if (v === undefined) return undefined;
  if (typeof v !== 'string') throw new ServiceError('bad_request', `\`${name}\` must be given once.`);
  return v;
}

/** Base64 of bytes handed over in pieces: a piece's last bytes short of three wait for the next. */
function base64Stream() {
  let carry: Buffer = Buffer.alloc(0);
  return {
    push(b: Buffer): string {
      const all = carry.length ? Buffer.concat([carry, b]) : b;
      const whole = all.length - (all.length % 3);
      carry = all.subarray(whole);
      return all.subarray(0, whole).toString('base64');
    },
    end: () => carry.toString('base64'),
  };
}

const swept = (record: ExportRow) => record.expired;
const size = (record: ExportRow) => record.request_bytes + record.response_bytes + record.chunk_bytes;
// A running stream's frame bytes are counted when it ends: its size is not known yet.
const large = (record: ExportRow) => size(record) > GROUP_BYTES || (record.streaming && (record.status === 'pending' || record.status === 'running'));

/** The line's head: the listing row and the failure status, without its closing brace. */
const head = (record: ExportRow) => JSON.stringify({ ...listingRow(record), error_status: record.error_status }).slice(0, -1);

function answerFields(payload: StoredPayload): string {
  return `,"response_status":${payload.response_status},"response_content_type":${JSON.stringify(payload.response_content_type)}`;
}

/** Records small enough to read together: their lines, whole. */
async function smallGroup(deps: Deps, res: Response, group: ExportRow[]): Promise<void> {
  const ids = group.filter((record) => !swept(record)).map((record) => record.id);
  const stored = new Map((await payloads(deps.pool, ids, INLINE_ANSWER)).map((payload) => [payload.id, payload]));
  const frames = new Map<string, { read: FrameReader; bytes: Buffer[] }>();
  const streamed = group.filter((record) => record.streaming && !swept(record)).map((record) => record.id);
  let after: { id: string; seq: number } | null = null;
  while (streamed.length > 0) {
    const rows = await frameRows(deps.pool, streamed, after, FRAME_ROWS);
    for (const row of rows) {
      let stream = frames.get(row.request_id);
      if (!stream) frames.set(row.request_id, (stream = { read: createFrameReader(), bytes: [] }));
      for (const f of stream.read(row)) stream.bytes.push(frameBytes(f));
    }
    if (rows.length < FRAME_ROWS) break;
    after = { id: rows[rows.length - 1]!.request_id, seq: rows[rows.length - 1]!.last_seq };
  }
  const lines: string[] = [];
  for (const record of group) {
    const payload = stored.get(record.id);
    if (!payload) {
      lines.push(`${head(record)}}\n`);
      continue;
    }
    let line = `${head(record)},"request_body":${JSON.stringify(payload.body)}`;
    if (payload.response_status !== null) {
      const answer = payload.response_base64 ?? (await answerInPieces(deps, record.id, payload.response_length ?? 0));
      line += `${answerFields(payload)},"response_base64":"${answer.replace(/\n/g, '')}"`;
    }
    if (record.streaming) line += `,"stream_base64":"${Buffer.concat(frames.get(record.id)?.bytes ?? []).toString('base64')}"`;
    lines.push(`${line}}\n`);
  }
  await send(res, lines.join(''));
}

async function answerInPieces(deps: Deps, id: string, length: number): Promise<string> {
  let out = '';
  for (let from = 0; from < length; from += SLICE) out += await answerSlice(deps.pool, id, from, SLICE);
  return out;
}

/** A record too large to hold: its line written a piece at a time. */
async function largeRecord(deps: Deps, res: Response, record: ExportRow): Promise<void> {
  const [payload] = await payloads(deps.pool, [record.id], 0);
  await send(res, `${head(record)},"request_body":${JSON.stringify(payload?.body ?? null)}`);
  if (payload && payload.response_status !== null) {
    await send(res, `${answerFields(payload)},"response_base64":"`);
    for (let from = 0; from < (payload.response_length ?? 0); from += SLICE) await send(res, (await answerSlice(deps.pool, record.id, from, SLICE)).replace(/\n/g, ''));
    await send(res, '"');
  }
  if (record.streaming) {
    await send(res, ',"stream_base64":"');
    const b64 = base64Stream();
    const read = createFrameReader();
    let after: { id: string; seq: number } | null = null;
    for (;;) {
      const rows = await frameRows(deps.pool, [record.id], after, FRAME_ROWS);
      for (const row of rows) await send(res, b64.push(Buffer.concat(read(row).map(frameBytes))));
      if (rows.length < FRAME_ROWS) break;
      after = { id: record.id, seq: rows[rows.length - 1]!.last_seq };
    }
    await send(res, `${b64.end()}"`);
  }
  await send(res, '}\n');
}

export function exportRoute(deps: Deps, router: Router, scope: NamespaceScope): void {
  router.get(`${scope.base}/requests/export`, ...scope.guards, async (req: Request, res: Response) => {
    const namespaceId = scope.namespaceId(res);
    const sinceText = param(req, 'since');
    const untilText = param(req, 'until');
    const since = sinceText === undefined ? null : parseInstant('since', sinceText);
    // Without `until`, the export ends at its start: it does not chase records made meanwhile.
    const until = untilText === undefined ? new Date() : parseInstant('until', untilText);
    const withPayloads = param(req, 'with_payloads');
    if (withPayloads !== undefined && withPayloads !== 'true' && withPayloads !== 'false') {
      throw new ServiceError('bad_request', '`with_payloads` must be true or false.');
    }
    let after = param(req, 'after') ?? null;
    if (after !== null && !isId(after, 'req')) throw new ServiceError('bad_request', '`after` must be a request id (req_...), the last one an export wrote.');

    let page = await exportPage(deps.pool, namespaceId, after, since, until, PAGE);
    res.status(200).set({ 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' });
    res.flushHeaders();
    while (page.length > 0 && !res.destroyed) {
      if (withPayloads !== 'true') await send(res, page.map((record) => `${head(record)}}\n`).join(''));
      else {
        let group: ExportRow[] = [];
        let bytes = 0;
        for (const record of page) {
          if (!swept(record) && large(record)) {
            if (group.length) await smallGroup(deps, res, group);
            group = [];
            bytes = 0;
            await largeRecord(deps, res, record);
            continue;
          }
          if (bytes + size(record) > GROUP_BYTES) {
            await smallGroup(deps, res, group);
            group = [];
            bytes = 0;
          }
          group.push(record);
          bytes += swept(record) ? 0 : size(record);
        }
        if (group.length) await smallGroup(deps, res, group);
      }
      after = page[page.length - 1]!.id;
      page = page.length < PAGE ? [] : await exportPage(deps.pool, namespaceId, after, since, until, PAGE);
    }
    res.end();
  });
}
