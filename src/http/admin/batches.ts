// A namespace's batches for a console session (viewer): both vendors' batches, newest first,
// with their lines counted by state (the console's progress bar), and a batch's lines, each
// naming its request (docs/console.md "Batches").
import type { Request, Response, Router } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { openaiStatus } from '../../core/batch-shapes.ts';
import { listBatches, listLines, type BatchView } from '../../db/batches.ts';
import { consoleAuth } from './console-auth.ts';
import { namespaceParam, namespaceOf } from './namespaces.ts';
import { parseLimit } from '../service/accounts.ts';

function status(b: BatchView): string {
  if (b.vendor === 'openai') return openaiStatus(b);
  return b.ended_at !== null ? 'ended' : b.cancelling_at !== null ? 'canceling' : 'in_progress';
}

const view = (b: BatchView) => ({
  id: b.id,
  vendor: b.vendor,
  endpoint: b.endpoint,
  status: status(b),
  total: b.total,
  counts: b.counts,
  created_at: b.created_at.toISOString(),
  ended_at: b.ended_at?.toISOString() ?? null,
  metadata: b.metadata,
});

function query(req: Request, name: string): string | undefined {
  const v = req.query[name];
  if (v === undefined) return undefined;
  if (typeof v !== 'string' || v.length > 200) throw new ServiceError('bad_request', `\`${name}\` must be given once.`);
  return v;
}

export function batchConsoleRoutes(deps: Deps, router: Router): void {
  const base = '/:tenancy/v1/namespaces/:ns/batches';
  const guards = [consoleAuth(deps, 'viewer'), namespaceParam(deps)];

  router.get(base, ...guards, async (req: Request, res: Response) => {
    const limit = parseLimit(query(req, 'limit'));
    const rows = await listBatches(deps.pool, namespaceOf(res).id, null, { after: query(req, 'after') ?? null, before: null, limit: limit + 1 });
    const page = rows.slice(0, limit);
    res.json({ data: page.map(view), next_after: rows.length > limit ? page.at(-1)!.id : null });
  });

  router.get(`${base}/:id/lines`, ...guards, async (req: Request, res: Response) => {
    const batchId = String(req.params.id);
    const [batch] = await listBatches(deps.pool, namespaceOf(res).id, null, { after: null, before: null, limit: 1, id: batchId });
    if (!batch) throw new ServiceError('not_found', 'No such batch in this namespace.');
    const limit = parseLimit(query(req, 'limit'));
    const after = query(req, 'after');
    if (after !== undefined && !/^\d{1,9}$/.test(after)) throw new ServiceError('bad_request', '`after` must be a line number.');
    const rows = await listLines(deps.pool, batchId, Number(after ?? 0), limit + 1);
    const page = rows.slice(0, limit);
    res.json({ batch: view(batch), data: page, next_after: rows.length > limit ? page.at(-1)!.line : null });
  });
}
