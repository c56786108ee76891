// Where one execution of a many-part statement spends its time and its WAL, by the parts that
// write: EXPLAIN (ANALYZE, WAL, FORMAT JSON) of the statement as Sarsen sends it, each insert,
// update and delete given its own time and WAL: its node's less its input's. (A part's input may
// be another part, run when first read; an init plan beside the input may read one too, and is
// counted again in the input, so it is not taken off.) The rest of the execution is "the rest":
// reading the parameters, the parts that only read, an update's join with its answers, the final
// select. (A reading part's own time cannot be told apart: the first to read another part runs
// it, inside its own.)
import type pg from 'pg';

type PlanNode = {
  'Node Type': string;
  'Parent Relationship'?: string;
  Operation?: string;
  'Relation Name'?: string;
  'Actual Total Time'?: number;
  'Actual Loops'?: number;
  'WAL Records'?: number;
  'WAL Bytes'?: number;
  Plans?: PlanNode[];
};

export type PlanPart = { part: string; ms: number; walRecords: number | null; walBytes: number | null };
export type Explained = { planningMs: number; executionMs: number; parts: PlanPart[] };

const time = (n: PlanNode): number => (n['Actual Total Time'] ?? 0) * (n['Actual Loops'] ?? 1);
const walRecords = (n: PlanNode): number => n['WAL Records'] ?? 0;
const walBytes = (n: PlanNode): number => n['WAL Bytes'] ?? 0;

function parts(node: PlanNode, into: PlanPart[]): void {
  const children = node.Plans ?? [];
  const inputs = children.filter((c) => c['Parent Relationship'] !== 'InitPlan' && c['Parent Relationship'] !== 'SubPlan');
  const own = (f: (n: PlanNode) => number) => f(node) - inputs.reduce((s, c) => s + f(c), 0);
  if (node['Node Type'] === 'ModifyTable') {
    into.push({ part: `${node.Operation?.toLowerCase()} ${node['Relation Name']}`, ms: own(time), walRecords: own(walRecords), walBytes: own(walBytes) });
  }
  for (const c of children) parts(c, into);
}

/** Runs `config` (a statement as the writer sends it) under EXPLAIN ANALYZE: it really executes. */
export async function explainParts(db: pg.Pool, config: pg.QueryConfig): Promise<Explained> {
  const { rows } = await db.query<{ 'QUERY PLAN': [{ Plan: PlanNode; 'Planning Time': number; 'Execution Time': number }] }>({
    text: `EXPLAIN (ANALYZE, WAL, FORMAT JSON) ${config.text}`,
    values: config.values,
  });
  const [plan] = rows[0]!['QUERY PLAN'];
  const found: PlanPart[] = [];
  parts(plan.Plan, found);
  found.push({ part: 'the rest', ms: plan['Execution Time'] - found.reduce((s, p) => s + p.ms, 0), walRecords: null, walBytes: null });
  return { planningMs: plan['Planning Time'], executionMs: plan['Execution Time'], parts: found };
}
