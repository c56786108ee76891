// A tar reader for the archives @sparticuz/chromium ships (plain ustar or old GNU headers,
// regular files and folders only), so unpacking them needs neither a system `tar` nor a
// dependency we do not declare. Anything else in an archive is refused rather than guessed at.
import fs from 'node:fs';
import path from 'node:path';

const BLOCK = 512;

function text(header: Buffer, start: number, length: number): string {
  const field = header.subarray(start, start + length);
  const end = field.indexOf(0);
  return field.subarray(0, end === -1 ? length : end).toString('utf8');
}

function octal(header: Buffer, start: number, length: number, what: string): number {
  const digits = text(header, start, length).trim();
  if (!/^[0-7]+$/.test(digits)) throw new Error(`tar: unreadable ${what} ${JSON.stringify(digits)}`);
  return Number.parseInt(digits, 8);
}

/** Writes every file and folder of `archive` under `dest` (which must exist). */
export function extractTar(archive: Buffer, dest: string): void {
  for (let at = 0; at + BLOCK <= archive.length; ) {
    const header = archive.subarray(at, at + BLOCK);
    if (header.every((byte) => byte === 0)) return; // the end-of-archive blocks
    // The checksum counts its own eight bytes as spaces.
    let sum = 0;
    for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 0x20 : header[i]!;
    if (sum !== octal(header, 148, 8, 'checksum')) throw new Error(`tar: bad header checksum at byte ${at}`);
    // Only POSIX ustar has the name prefix; old GNU headers keep other fields there.
    const posix = text(header, 257, 6) === 'ustar' && text(header, 263, 2) === '00';
    const prefix = posix ? text(header, 345, 155) : '';
    const name = prefix ? `${prefix}/${text(header, 0, 100)}` : text(header, 0, 100);
    const size = octal(header, 124, 12, 'size');
    const type = String.fromCharCode(header[156]!);
    const target = path.resolve(dest, name);
    if (path.isAbsolute(name) || !target.startsWith(path.resolve(dest) + path.sep)) {
      throw new Error(`tar: entry ${JSON.stringify(name)} would land outside ${dest}`);
    }
    const body = at + BLOCK;
    if (type === '0' || type === '\0') {
      if (body + size > archive.length) throw new Error(`tar: ${name} is cut short`);
      fs.mkdirSync(path.dirname(target), { recursive: true });
      fs.writeFileSync(target, archive.subarray(body, body + size), { mode: octal(header, 100, 8, 'mode') & 0o777 });
    } else if (type === '5') {
      fs.mkdirSync(target, { recursive: true });
    } else {
      throw new Error(`tar: entry ${JSON.stringify(name)} has type ${JSON.stringify(type)}, which this reader does not handle`);
    }
    at = body + Math.ceil(size / BLOCK) * BLOCK;
  }
  throw new Error('tar: the archive ends without its end-of-archive blocks');
}
