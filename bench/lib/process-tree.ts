// A side of the benchmark as the processes it runs in: Sarsen under `--processes N` is a
// primary and its workers, so its CPU and memory are summed over the process and everything it
// started (read from /proc; NaN where that cannot be read).
import fs from 'node:fs';
import { processCpuMs } from './cpu.ts';
import { memoryMb } from './stream-sarsen.ts';

/** `pid` and every live process below it. */
export function processTree(pid: number): number[] {
  const children = new Map<number, number[]>();
  let entries: string[];
  try {
    entries = fs.readdirSync('/proc');
  } catch {
    return [pid];
  }
  for (const e of entries) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${e}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(e)]);
    } catch {
      // the process ended while we looked
    }
  }
  const tree = [pid];
  for (let i = 0; i < tree.length; i++) tree.push(...(children.get(tree[i]!) ?? []));
  return tree;
}

/** User + system CPU time of `pid` and its descendants now alive, in ms. */
export function treeCpuMs(pid: number): number {
  return processTree(pid).reduce((sum, p) => sum + (processCpuMs(p) || 0), 0);
}

/** Samples the summed VmRSS of `pid`'s tree every `everyMs` until stopped; answers the highest seen, in MB. */
export function sampleTreeRss(pid: number, everyMs = 100): { stop(): number } {
  let pids = processTree(pid);
  let ticks = 0;
  const rss = () => pids.reduce((sum, p) => sum + (memoryMb(p).rss || 0), 0);
  let peak = rss();
  const timer = setInterval(() => {
    if (++ticks % 20 === 0) pids = processTree(pid); // a replaced worker
    peak = Math.max(peak, rss());
  }, everyMs);
  return {
    stop() {
      clearInterval(timer);
      return peak;
    },
  };
}
