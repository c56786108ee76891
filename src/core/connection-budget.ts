// How many PostgreSQL connections one Sarsen process may hold, by purpose (docs/scaling.md has
// the formula an operator sizes max_connections with). One number bounds the total; the fixed
// parts are taken first and the rest goes to the main pool:
//
//   bus      1   the LISTEN connection (also holds an executor's liveness lock)
//   queue    3   graphile-worker: its LISTEN connection, a job fetch and a completion batch
//   writers      the group-committing writers' lanes, one pool they share: submissions (2 lanes)
//                in a process with the API; claims (1), frames (1) and terminal writes (2) in
//                one that executes
//   main         everything else: reads, metered submissions, retries, sweeps, administration
//
// Above the default total the main pool grows. Below it the main pool shrinks first (to 2), then
// graphile-worker's third connection goes, then the writers' lanes (they take turns on fewer
// connections: a batch waiting for one only grows); never the bus.

type Role = 'api' | 'executor' | 'both';

export const PURPOSES = ['main', 'bus', 'queue', 'writers'] as const;
export type Purpose = (typeof PURPOSES)[number];

export type ConnectionBudget = Readonly<Record<Purpose, number> & { total: number }>;

/** The main pool a process gets when no total is given; the default total follows from it. */
const DEFAULT_MAIN: Record<Role, number> = { api: 8, executor: 4, both: 8 };
const MIN_MAIN = 2;
const QUEUE = 3;
const MIN_QUEUE = 2;

const apiRole = (role: Role) => role !== 'executor';
const executes = (role: Role) => role !== 'api';

/** Writer lanes a role opens when it has the connections for them. */
export function writerLanes(role: Role): number {
  return (apiRole(role) ? 2 : 0) + (executes(role) ? 4 : 0);
}

/** The smallest total a role can run with: bus, main pool, one writer lane, and graphile-worker's two. */
export function minimumConnections(role: Role): number {
  return 1 + MIN_MAIN + 1 + (executes(role) ? MIN_QUEUE : 0);
}

export function defaultConnections(role: Role): number {
  return 1 + (executes(role) ? QUEUE : 0) + writerLanes(role) + DEFAULT_MAIN[role];
}

/** Splits `total` (default: the role's default) among the purposes; throws RangeError below the minimum. */
export function connectionBudget(role: Role, total: number = defaultConnections(role)): ConnectionBudget {
  const min = minimumConnections(role);
  if (!Number.isInteger(total) || total < min) throw new RangeError(`a ${role} process needs at least ${min} database connections (got ${total})`);
  let spare = total - min;
  const take = (wanted: number) => {
    const n = Math.min(wanted, spare);
    spare -= n;
    return n;
  };
  const writers = 1 + take(writerLanes(role) - 1);
  const queue = executes(role) ? MIN_QUEUE + take(QUEUE - MIN_QUEUE) : 0;
  const main = MIN_MAIN + spare;
  return Object.freeze({ total, bus: 1, queue, writers, main });
}
