// The acceptance statement runs in shapes (src/db/submissions.ts): a batch whose every submission
// this process claims writes no job, and a batch without a caller's credential writes none. A
// batch mixing both kinds, identical bodies and a submission tried again after its first try's
// answer was lost must write what each submission needs, whichever shape it ran.
import { expect } from 'chai';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';
import { track } from '../support/resources.ts';
import { createBatchPool, type Pool } from '../../src/db/pool.ts';
import { ENSURE_TASK_SQL } from '../../src/db/jobs.ts';
import { submitBatch, type NewRequest, type Submitted } from '../../src/db/submissions.ts';
import { newId } from '../../src/core/ids.ts';

describe('acceptance statement shapes', function () {
  this.timeout(30_000);
  let db: TestDatabase;
  let pool: Pool;
  let release: () => void;
  const SETTINGS = { windowMs: 600_000, feeMicros: 5, leaseMs: 30_000 };

  before(async () => {
    db = await createTestDatabase();
    pool = createBatchPool(db.conn, 'sarsen-shape-probe', 1);
    release = track('pool', db.name);
    await pool.query(ENSURE_TASK_SQL);
  });
  after(async () => {
    await pool?.end();
    release?.();
    await db?.drop();
  });

  const submission = (over: Partial<NewRequest> = {}): NewRequest => ({
    id: newId('req'), tenancyId: 'ten_shape', namespaceId: 'ns_shape', apiKeyId: 'key_shape', backendId: 'bk_shape', fallbackBackendIds: [],
    dialect: 'chat', streaming: false, model: 'm', upstreamModel: 'm', forwardedHeaders: [], hops: 0, body: '{"x":1}',
    identity: Buffer.from(newId('req')), sealedCredential: null, owner: 'wrk_shape', precounted: false, limits: null, cache: null, ...over,
  });
  const count = async (sql: string, ids: string[]): Promise<number> => (await pool.query<{ n: number }>(sql, [ids])).rows[0]!.n;

  it('writes a job only for work left to others, a credential only where one was brought, one request per identity', async () => {
    const owned = submission();
    const queued = submission({ owner: null, sealedCredential: Buffer.from('sealed') });
    const same = submission({ identity: owned.identity }); // an identical body, later in the batch
    const answers = (await submitBatch(pool, [owned, queued, same], SETTINGS)) as Submitted[];
    expect(answers.map((a) => [a.requestId, a.attached, a.status, a.jobId !== null])).to.deep.equal([
      [owned.id, false, 'pending', false],
      [queued.id, false, 'pending', true],
      [owned.id, true, 'pending', false],
    ]);
    const ids = [owned.id, queued.id, same.id];
    expect(await count(`SELECT count(*)::int AS n FROM sarsen.requests WHERE id = ANY($1)`, ids)).to.equal(2);
    expect(await count(`SELECT count(*)::int AS n FROM graphile_worker._private_jobs WHERE key = ANY($1)`, ids)).to.equal(1);
    expect(await count(`SELECT count(*)::int AS n FROM sarsen.request_credentials WHERE request_id = ANY($1)`, ids)).to.equal(1);
    const { rows } = await pool.query<{ kind: string; n: number; micros: number }>(
      `SELECT kind, count(*)::int AS n, sum(amount_micros)::int AS micros FROM sarsen.ledger WHERE request_id = ANY($1) GROUP BY kind ORDER BY kind`, [ids],
    );
    expect(rows).to.deep.equal([{ kind: 'attach', n: 1, micros: 0 }, { kind: 'execution', n: 2, micros: 10 }]);

    // The owned submission again, as after a lost answer: the request its first try created, running, and nothing written again.
    const [again] = (await submitBatch(pool, [owned], SETTINGS)) as Submitted[];
    expect([again!.requestId, again!.attached, again!.status, again!.jobId]).to.deep.equal([owned.id, false, 'running', null]);
    expect(await count(`SELECT count(*)::int AS n FROM sarsen.ledger WHERE request_id = ANY($1)`, ids)).to.equal(3);
    // A new submission of the same body attaches to the live request, and is counted once.
    const later = submission({ identity: owned.identity });
    const [attached] = (await submitBatch(pool, [later], SETTINGS)) as Submitted[];
    expect([attached!.requestId, attached!.attached, attached!.status]).to.deep.equal([owned.id, true, 'running']);
    expect(await count(`SELECT count(*)::int AS n FROM sarsen.ledger WHERE request_id = ANY($1)`, ids)).to.equal(4);
  });
});
