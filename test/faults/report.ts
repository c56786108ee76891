// The fault suite's summary: each scenario adds a row, and each test file writes its section of
// docs/reliability.md (between its markers) once its scenarios ran, so the page always carries the
// latest run of `npm run test:faults` and the command that reproduces it.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const PAGE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../docs/reliability.md');

export const seconds = (ms: number | null): string => (ms === null ? 'n/a' : `${(ms / 1000).toFixed(1)} s`);

export function createReport(section: string, columns: readonly string[]): { add(cells: readonly (string | number)[]): void; write(): void } {
  const rows: string[] = [];
  return {
    add: (cells) => void rows.push(`| ${cells.join(' | ')} |`),
    write() {
      if (rows.length === 0 || !fs.existsSync(PAGE)) return;
      const begin = `<!-- faults:${section}:begin -->`;
      const end = `<!-- faults:${section}:end -->`;
      const page = fs.readFileSync(PAGE, 'utf8');
      const from = page.indexOf(begin);
      const to = page.indexOf(end);
      if (from < 0 || to < from) return;
      const table = [
        `| ${columns.join(' | ')} |`,
        `|${columns.map(() => '---').join('|')}|`,
        ...rows,
        '',
        `Last run: ${new Date().toISOString().slice(0, 10)}, \`npm run test:faults\`.`,
      ].join('\n');
      fs.writeFileSync(PAGE, `${page.slice(0, from + begin.length)}\n${table}\n${page.slice(to)}`);
    },
  };
}
