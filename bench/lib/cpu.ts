// Where the machine's CPU goes during a phase: the Sarsen child, the PostgreSQL server's
// processes and this (load generator + fake provider) process, read from /proc (Linux only;
// NaN elsewhere). Figures are in percent of one core over the phase.
import fs from 'node:fs';
import os from 'node:os';
import type pg from 'pg';

const TICKS_PER_SECOND = 100; // USER_HZ on Linux

function statFields(pid: number): string[] | null {
  try {
    const text = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name is parenthesised and may hold spaces: split after its closing paren.
    return text.slice(text.lastIndexOf(')') + 2).split(' ');
  } catch {
    return null;
  }
}

/** User + system CPU time of a live process, in ms (NaN when unreadable). */
export function processCpuMs(pid: number): number {
  const f = statFields(pid);
  if (!f) return NaN;
  // After the name: state(0) ppid(1) ... utime(11) stime(12)
  return ((Number(f[11]) + Number(f[12])) * 1000) / TICKS_PER_SECOND;
}

function parentOf(pid: number): number | null {
  const f = statFields(pid);
  return f ? Number(f[1]) : null;
}

/** The postmaster's pid, from one backend of the server `pool` talks to (null when not local). */
export async function postmasterPid(pool: pg.Pool): Promise<number | null> {
  const { rows } = await pool.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
  const backend = rows[0]?.pid;
  return backend === undefined ? null : parentOf(backend);
}

/** User + system CPU time of the children a process has reaped, in ms (NaN when unreadable). */
function reapedCpuMs(pid: number): number {
  const f = statFields(pid);
  if (!f) return NaN;
  // cutime(13) cstime(14)
  return ((Number(f[13]) + Number(f[14])) * 1000) / TICKS_PER_SECOND;
}

/**
 * CPU time of the postmaster and all its children, in ms: the live ones, and those it reaped
 * (without them, a backend that exits within a window takes its CPU out of the difference).
 */
export function serverCpuMs(postmaster: number | null): number {
  if (postmaster === null) return NaN;
  let total = processCpuMs(postmaster) + reapedCpuMs(postmaster);
  let entries: string[];
  try {
    entries = fs.readdirSync('/proc');
  } catch {
    return NaN;
  }
  for (const e of entries) {
    if (!/^\d+$/.test(e)) continue;
    if (parentOf(Number(e)) === postmaster) total += processCpuMs(Number(e)) || 0;
  }
  return total;
}

/**
 * The whole machine's CPU time so far, in ms summed over its cores (/proc/stat): `busy` (user,
 * nice, system, interrupts) and `steal` (what the hypervisor gave other guests while this one
 * wanted to run). NaN off Linux.
 */
export function machineCpuMs(): { busy: number; steal: number } {
  try {
    const f = fs.readFileSync('/proc/stat', 'utf8').split('\n', 1)[0]!.trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal
    const [user, nice, system, , , irq, softirq, steal] = f as [number, number, number, number, number, number, number, number];
    return { busy: ((user + nice + system + irq + softirq) * 1000) / TICKS_PER_SECOND, steal: (steal * 1000) / TICKS_PER_SECOND };
  } catch {
    return { busy: NaN, steal: NaN };
  }
}

export type CpuSnapshot = { at: number; sarsen: number; postgres: number; bench: number };
export type CpuShares = { sarsen: number; postgres: number; bench: number; idle: number };

export function cpuSnapshot(sarsenPid: number, postmaster: number | null): CpuSnapshot {
  const u = process.cpuUsage();
  return { at: performance.now(), sarsen: processCpuMs(sarsenPid), postgres: serverCpuMs(postmaster), bench: (u.user + u.system) / 1000 };
}

/** Percent of one core each used between two snapshots; idle is what is left of all cores. */
export function cpuShares(a: CpuSnapshot, b: CpuSnapshot): CpuShares {
  const wall = b.at - a.at;
  const pct = (x: number) => (x / wall) * 100;
  const sarsen = pct(b.sarsen - a.sarsen);
  const postgres = pct(b.postgres - a.postgres);
  const bench = pct(b.bench - a.bench);
  return { sarsen, postgres, bench, idle: os.cpus().length * 100 - sarsen - postgres - bench };
}
