// The final text of every generated batch statement (each shape of the terminal write
// included) is kept in test/sql-snapshots/<name>.sql, so that a change to a statement shows in
// review as the statement itself. UPDATE_SQL_SNAPSHOTS=1 rewrites the files from the code.
import fs from 'node:fs';
import { expect } from 'chai';
import { SUBMISSION_SQL } from '../../src/db/submissions.ts';
import { ATTEMPT_SQL } from '../../src/db/attempts.ts';
import { FRAME_SQL } from '../../src/db/chunks.ts';
import { RECOVERY_SQL } from '../../src/db/recovery.ts';

const DIR = new URL('../sql-snapshots/', import.meta.url);
const UPDATE = process.env.UPDATE_SQL_SNAPSHOTS === '1';
const HOW = 'if the change is meant, rewrite the snapshots with UPDATE_SQL_SNAPSHOTS=1 npx mocha test/unit/sql-snapshots.test.ts and commit them';
const statements: Record<string, string> = { ...SUBMISSION_SQL, ...ATTEMPT_SQL, ...FRAME_SQL, ...RECOVERY_SQL };

describe('SQL snapshots of the batch statements', () => {
  if (UPDATE) fs.mkdirSync(DIR, { recursive: true });

  for (const [name, text] of Object.entries(statements)) {
    it(`${name} is as test/sql-snapshots/${name}.sql says`, () => {
      const file = new URL(`${name}.sql`, DIR);
      if (UPDATE) fs.writeFileSync(file, `${text}\n`);
      const kept = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : null;
      expect(kept, `test/sql-snapshots/${name}.sql is missing; ${HOW}`).to.not.equal(null);
      expect(`${text}\n`, `${name} differs from test/sql-snapshots/${name}.sql; ${HOW}`).to.equal(kept);
    });
  }

  it('keeps no snapshot of a statement that is gone', () => {
    const stale = (fs.existsSync(DIR) ? fs.readdirSync(DIR) : []).filter((f) => !(f.replace(/\.sql$/, '') in statements));
    if (UPDATE) for (const f of stale) fs.rmSync(new URL(f, DIR));
    else expect(stale, `snapshots of statements that no longer exist; ${HOW}`).to.deep.equal([]);
  });
});
