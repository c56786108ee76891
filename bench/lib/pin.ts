// CPU affinity for the capacity benchmark (Linux; taskset from util-linux): the load (the
// provider, wrk, the callers) on some cores, the proxy under test on others, so that what the
// proxy carries is what its own cores carry. A process's new threads and children inherit its
// affinity, so pinning a process tree once covers what it starts later; pinning again before
// each measurement catches a worker that was replaced meanwhile.
import fs from 'node:fs';
import { execFileSync } from 'node:child_process';
import { processTree } from './process-tree.ts';

/** The CPUs this process may run on, as a list ("0-1" → [0, 1]). */
export function allowedCpus(pid: number | 'self' = 'self'): number[] {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const list = /^Cpus_allowed_list:\s*(\S+)/m.exec(status)?.[1];
  if (!list) throw new Error(`cannot read the CPU affinity of ${pid}`);
  return parseCpuList(list);
}

/** "0,2-3" → [0, 2, 3]. */
export function parseCpuList(list: string): number[] {
  const cpus: number[] = [];
  for (const part of list.split(',')) {
    const [from, to = from] = part.split('-').map(Number) as [number, number?];
    if (!Number.isInteger(from) || !Number.isInteger(to) || to! < from) throw new Error(`not a CPU list: ${list}`);
    for (let c = from; c <= to!; c++) cpus.push(c);
  }
  return cpus;
}

/** Whether taskset can be run here. */
export function hasTaskset(): boolean {
  try {
    execFileSync('taskset', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/**
 * Pins every thread of each process (`taskset -a`) to `cpus` ("1", "0,2"). A process that ended
 * meanwhile is skipped; any other failure throws.
 */
export function pin(pids: readonly number[], cpus: string): void {
  for (const pid of pids) {
    try {
      execFileSync('taskset', ['-a', '-p', '-c', cpus, String(pid)], { stdio: ['ignore', 'ignore', 'pipe'] });
    } catch (err) {
      if (fs.existsSync(`/proc/${pid}`)) throw new Error(`taskset could not pin ${pid} to CPUs ${cpus}: ${String((err as { stderr?: unknown }).stderr ?? err).trim()}`);
    }
  }
}

/** Pins `pid` and every process below it. */
export function pinTree(pid: number, cpus: string): void {
  pin(processTree(pid), cpus);
}

/** Throws unless every process in `pid`'s tree may run only on `cpus`: a pin that did not take is a run that measures nothing. */
export function assertPinned(pid: number, cpus: string): void {
  const want = parseCpuList(cpus).join(',');
  for (const p of processTree(pid)) {
    let have: string;
    try {
      have = allowedCpus(p).join(',');
    } catch {
      continue; // ended meanwhile
    }
    if (have !== want) throw new Error(`process ${p} may run on CPUs ${have}, not only ${want}`);
  }
}

/**
 * Busy time so far of the given CPUs, in ms summed over them (/proc/stat's per-CPU lines: user,
 * nice, system, irq, softirq and steal). Whether a set of CPUs was saturated over a run says
 * which side bounded it: the proxy's CPU at 100% is its capacity, the load's at 100% is not.
 */
export function cpusBusyMs(cpus: readonly number[]): number {
  const TICKS_PER_SECOND = 100; // USER_HZ on Linux
  let ticks = 0;
  for (const line of fs.readFileSync('/proc/stat', 'utf8').split('\n')) {
    const m = /^cpu(\d+)\s+(.*)$/.exec(line);
    if (!m || !cpus.includes(Number(m[1]))) continue;
    const [user, nice, system, , , irq, softirq, steal] = m[2]!.trim().split(/\s+/).map(Number) as number[];
    ticks += user! + nice! + system! + irq! + softirq! + steal!;
  }
  return (ticks * 1000) / TICKS_PER_SECOND;
}
