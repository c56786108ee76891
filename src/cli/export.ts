// `sarsen export --tenancy T --namespace N [--since S] [--until U] [--with-payloads] --out FILE.jsonl[.gz]`
// (docs/storage.md): a namespace's records written to a file before retention sweeps them, read
// over HTTP from GET .../requests/export with a key holding the manage grant, so it works
// against a remote Sarsen. It holds one chunk of the answer at a time (constant memory), and a
// run that was killed is continued by running the same command again: it finds where the file
// stopped (the last whole line; for .gz the last whole member, written so it can be found) and
// asks for the records after it.
import fs from 'node:fs';
import zlib from 'node:zlib';
import { promisify } from 'node:util';
import { ConfigError } from '../config/config.ts';
import { idTime, isId } from '../core/ids.ts';
import type { Flags, FlagValues } from '../core/flags.ts';

/** Its flags (src/cli/commands.ts parses them and prints them as its usage). */
export const EXPORT_FLAGS = {
  tenancy: { type: 'string', value: 'T', required: true, help: 'the tenancy\'s slug' },
  namespace: { type: 'string', value: 'N', required: true, help: 'the namespace\'s slug' },
  out: { type: 'string', value: 'FILE.jsonl[.gz]', required: true, help: 'the file (.gz: gzip); run the same command again to continue a run that stopped' },
  since: { type: 'string', value: 'S', help: 'records created at or after S (epoch milliseconds or ISO 8601)' },
  until: { type: 'string', value: 'U', help: 'records created before U (default: when the export starts)' },
  'with-payloads': { type: 'boolean', help: 'each line also carries the record\'s payloads' },
  url: { type: 'string', value: 'URL', default: 'http://127.0.0.1:8080', help: 'the Sarsen deployment' },
  'key-file': { type: 'string', value: 'FILE', help: 'a file holding a key with the manage grant (default: the SARSEN_API_KEY variable)' },
} as const satisfies Flags;

const deflateRaw = promisify(zlib.deflateRaw);
const fsWrite = promisify(fs.write);

// .gz files are gzip members (any gunzip reads them as one stream) of about MEMBER_BYTES of
// whole lines, each carrying its own length in an extra field (subfield "SX"), so a run can
// walk them and cut the file after the last whole one.
const MEMBER_BYTES = 1024 * 1024;
const MAX_MEMBER_BYTES = 4 * MEMBER_BYTES; // a line longer than this spans members
const HEADER = 20;
const TRAILER = 8;

function memberHeader(total: number): Buffer {
  const h = Buffer.alloc(HEADER);
  h.set([0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 0xff], 0);
  h.writeUInt16LE(8, 10);
  h.set([0x53, 0x58], 12); // "SX"
  h.writeUInt16LE(4, 14);
  h.writeUInt32LE(total, 16);
  return h;
}

async function member(data: Buffer): Promise<Buffer> {
  const body = await deflateRaw(data);
  const trailer = Buffer.alloc(TRAILER);
  trailer.writeUInt32LE(zlib.crc32(data), 0);
  trailer.writeUInt32LE(data.length % 2 ** 32, 4);
  return Buffer.concat([memberHeader(HEADER + body.length + TRAILER), body, trailer]);
}

/** The request id a line starts with (every line starts `{"request_id":"req_...`). */
function lineId(head: string): string | null {
  const m = /^\{"request_id":"([^"]+)"/.exec(head);
  return m && isId(m[1], 'req') ? m[1]! : null;
}

/** Counts the lines in pieces of a stream and remembers the id of the last whole one. */
class Lines {
  count = 0;
  lastId: string | null = null;
  private head = '';
  push(b: Uint8Array): void {
    let from = 0;
    for (;;) {
      const nl = b.indexOf(0x0a, from);
      const end = nl < 0 ? b.length : nl;
      if (this.head.length < 80) this.head += Buffer.from(b.subarray(from, Math.min(end, from + 80))).toString('latin1');
      if (nl < 0) return;
      this.count++;
      this.lastId = lineId(this.head) ?? this.lastId;
      this.head = '';
      from = nl + 1;
    }
  }
}

type Resume = { after: string | null; records: number | null };

/** A plain file: cut after its last whole line, whose id is where to continue. */
function resumePlain(fd: number, size: number): Resume {
  const block = Buffer.alloc(64 * 1024);
  const lastNewline = (before: number): number => {
    for (let end = before; end > 0; ) {
      const start = Math.max(0, end - block.length);
      fs.readSync(fd, block, 0, end - start, start);
      const i = block.subarray(0, end - start).lastIndexOf(0x0a);
      if (i >= 0) return start + i;
      end = start;
    }
    return -1;
  };
  const last = lastNewline(size);
  fs.ftruncateSync(fd, last + 1);
  if (last < 0) return { after: null, records: 0 };
  const start = lastNewline(last) + 1;
  const n = fs.readSync(fd, block, 0, Math.min(80, last - start), start);
  const after = lineId(block.subarray(0, n).toString('latin1'));
  if (!after) throw new ConfigError('The file does not end with a line this command wrote: move it away, or name another --out.');
  return { after, records: null };
}

/** A .gz file: cut after its last whole member that ends a line. */
function resumeGzip(fd: number, size: number): Resume {
  const lines = new Lines();
  let good = { end: 0, count: 0, lastId: null as string | null };
  const head = Buffer.alloc(HEADER);
  for (let at = 0; at + HEADER <= size; ) {
    fs.readSync(fd, head, 0, HEADER, at);
    const ours = head[0] === 0x1f && head[1] === 0x8b && head[3] === 4 && head.readUInt16LE(10) === 8 && head[12] === 0x53 && head[13] === 0x58;
    if (!ours) {
      if (at === 0) throw new ConfigError('The file is not an export this command wrote: move it away, or name another --out.');
      break;
    }
    const total = head.readUInt32LE(16);
    if (at + total > size) break;
    const raw = Buffer.alloc(total);
    fs.readSync(fd, raw, 0, total, at);
    let data: Buffer;
    try {
      data = zlib.gunzipSync(raw);
    } catch {
      break; // torn by the kill
    }
    lines.push(data);
    at += total;
    if (data.length > 0 && data[data.length - 1] === 0x0a) good = { end: at, count: lines.count, lastId: lines.lastId };
  }
  fs.ftruncateSync(fd, good.end);
  return { after: good.lastId, records: good.count };
}

/** Where the answer's bytes go: appended as they come, or as gzip members of whole lines. */
function sink(fd: number, gzip: boolean) {
  let pending: Buffer[] = [];
  let pendingBytes = 0;
  const write = async (b: Uint8Array) => {
    for (let off = 0; off < b.length; ) off += (await fsWrite(fd, b, off, b.length - off)).bytesWritten;
  };
  const flush = async (all: boolean) => {
    const data = Buffer.concat(pending);
    const cut = all || data.length > MAX_MEMBER_BYTES ? data.length : data.lastIndexOf(0x0a) + 1;
    if (cut === 0) return;
    await write(await member(data.subarray(0, cut)));
    pending = cut < data.length ? [data.subarray(cut)] : [];
    pendingBytes = data.length - cut;
  };
  return {
    async push(b: Uint8Array): Promise<void> {
      if (!gzip) return write(b);
      pending.push(Buffer.from(b));
      pendingBytes += b.length;
      if (pendingBytes >= MEMBER_BYTES) await flush(false);
    },
    /** `whole`: the answer ended cleanly (else a torn last line is not worth a member). */
    async end(whole: boolean): Promise<void> {
      if (gzip && pendingBytes > 0) await flush(whole);
    },
  };
}

function progress(startMs: number, untilMs: number) {
  const tty = process.stderr.isTTY === true;
  const began = Date.now();
  let shown = 0;
  return (lines: Lines, done = false) => {
    const now = Date.now();
    if (!done && now - shown < (tty ? 200 : 5000)) return;
    shown = now;
    const at = lines.lastId ? idTime(lines.lastId) : startMs;
    const share = untilMs > startMs ? Math.min(1, Math.max(0, (at - startMs) / (untilMs - startMs))) : 1;
    const rate = Math.round((lines.count * 1000) / Math.max(1, now - began));
    const upTo = lines.lastId ? `, up to ${new Date(at).toISOString()}` : '';
    if (tty) {
      const bar = '#'.repeat(Math.round(share * 30)).padEnd(30, '-');
      process.stderr.write(`\r[${bar}] ${(share * 100).toFixed(0).padStart(3)}%  ${lines.count} records  ${rate}/s${upTo}  ${done ? '\n' : ''}`);
    } else process.stderr.write(`export: ${lines.count} records (${rate}/s)${upTo}\n`);
  };
}

export async function exportCommand(values: FlagValues<typeof EXPORT_FLAGS>, out: (line: string) => void): Promise<number> {
  const { tenancy, namespace, out: file } = values;
  const key = values['key-file'] ? fs.readFileSync(values['key-file'], 'utf8').trim() : process.env.SARSEN_API_KEY;
  if (!key) throw new ConfigError('No key: name a file holding it with --key-file, or set SARSEN_API_KEY.');
  const gzip = file.endsWith('.gz');

  const size = fs.existsSync(file) ? fs.statSync(file).size : 0;
  let resume: Resume = { after: null, records: 0 };
  if (size > 0) {
    const at = fs.openSync(file, 'r+');
    try {
      resume = gzip ? resumeGzip(at, size) : resumePlain(at, size);
    } finally {
      fs.closeSync(at);
    }
  }
  const fd = fs.openSync(file, 'a', 0o600);
  try {
    const query = new URLSearchParams();
    if (values.since) query.set('since', values.since);
    if (values.until) query.set('until', values.until);
    if (values['with-payloads']) query.set('with_payloads', 'true');
    if (resume.after) query.set('after', resume.after);
    const base = values.url.replace(/\/+$/, '');
    const res = await fetch(`${base}/${encodeURIComponent(tenancy)}/${encodeURIComponent(namespace)}/v1/requests/export?${query}`, {
      headers: { 'x-sarsen-key': key },
    });
    if (!res.ok || !res.body) {
      const text = await res.text();
      let why = text.slice(0, 300);
      try {
        const e = JSON.parse(text).error;
        why = `${e.code}: ${e.message}`;
      } catch {
        // not the error envelope
      }
      process.stderr.write(`sarsen export: ${res.status} ${why}\n`);
      return 1;
    }
    if (resume.after) process.stderr.write(`export: continuing ${file} after ${resume.after}${resume.records === null ? '' : ` (${resume.records} records in it)`}\n`);
    const toEnd = sink(fd, gzip);
    const lines = new Lines();
    const instant = (v: string) => (/^\d+$/.test(v) ? Number(v) : Date.parse(v));
    const startMs = values.since ? instant(values.since) : resume.after ? idTime(resume.after) : Date.now();
    const untilMs = values.until ? instant(values.until) : Date.now();
    const show = progress(startMs, untilMs);
    try {
      for await (const chunk of res.body) {
        lines.push(chunk);
        await toEnd.push(chunk);
        show(lines);
      }
    } catch (err) {
      await toEnd.end(false);
      show(lines, true);
      process.stderr.write(`sarsen export: the connection ended early (${(err as Error).message}); run the same command again to continue\n`);
      return 1;
    }
    await toEnd.end(true);
    show(lines, true);
    out(`exported ${lines.count} records to ${file}${resume.after ? ` (continued after ${resume.after})` : ''}`);
    return 0;
  } finally {
    fs.closeSync(fd);
  }
}
