// Reading a V8 .cpuprofile (what `node --cpu-prof` writes): self time by function and by
// module ("pg", "express", "node:internal", "src/db", ...), and inclusive time by function.
import fs from 'node:fs';
import path from 'node:path';

type CallFrame = { functionName: string; url: string; lineNumber: number };
type ProfileNode = { id: number; callFrame: CallFrame; children?: number[] };
type Profile = { nodes: ProfileNode[]; samples: number[]; timeDeltas: number[]; startTime: number; endTime: number };

export type Entry = { name: string; ms: number; share: number };
export type ProfileSummary = { totalMs: number; samples: number; selfByFunction: Entry[]; selfByModule: Entry[]; inclusiveByFunction: Entry[] };

/** A module bucket for a script URL: the npm package, node's internals, or a project folder. */
export function moduleOf(url: string, root: string): string {
  if (url === '') return '(native / vm)';
  if (url.startsWith('node:')) return url.startsWith('node:internal') ? 'node:internal' : url;
  const file = url.startsWith('file://') ? new URL(url).pathname : url;
  const pkg = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(file);
  if (pkg) return pkg[1]!;
  const rel = path.relative(root, file);
  if (rel.startsWith('..')) return file;
  const parts = rel.split(path.sep);
  return parts.length > 2 ? parts.slice(0, 2).join('/') : rel;
}

function frameName(f: CallFrame, root: string): string {
  const fn = f.functionName || '(anonymous)';
  if (!f.url) return fn;
  const file = f.url.startsWith('file://') ? new URL(f.url).pathname : f.url;
  const pkg = /node_modules\/(.*)$/.exec(file);
  const where = pkg ? pkg[1] : path.relative(root, file).startsWith('..') ? file : path.relative(root, file);
  return `${fn} ${where}:${f.lineNumber + 1}`;
}

function top(m: Map<string, number>, total: number, n: number): Entry[] {
  return [...m]
    .sort((a, b) => b[1] - a[1])
    .slice(0, n)
    .map(([name, us]) => ({ name, ms: us / 1000, share: total ? us / total : 0 }));
}

/**
 * `window` (µs on the monotonic clock, as `process.hrtime.bigint() / 1000n` reads it in any
 * process of the machine) keeps only the samples taken inside it.
 */
export function summariseProfile(file: string, root: string, n = 20, window?: { fromUs: number; toUs: number }): ProfileSummary {
  const p = JSON.parse(fs.readFileSync(file, 'utf8')) as Profile;
  const byId = new Map(p.nodes.map((node) => [node.id, node]));
  const parent = new Map<number, number>();
  for (const node of p.nodes) for (const c of node.children ?? []) parent.set(c, node.id);
  const selfUs = new Map<number, number>();
  let total = 0;
  let kept = 0;
  let at = p.startTime;
  for (let i = 0; i < p.samples.length; i++) {
    const dt = p.timeDeltas[i] ?? 0;
    at += dt;
    if (window && (at < window.fromUs || at > window.toUs)) continue;
    kept++;
    selfUs.set(p.samples[i]!, (selfUs.get(p.samples[i]!) ?? 0) + dt);
    total += dt;
  }
  const selfFn = new Map<string, number>();
  const selfMod = new Map<string, number>();
  const incl = new Map<string, number>();
  for (const [id, us] of selfUs) {
    const node = byId.get(id)!;
    const f = node.callFrame;
    const special = f.functionName.startsWith('(') && f.url === '';
    selfFn.set(frameName(f, root), (selfFn.get(frameName(f, root)) ?? 0) + us);
    const mod = special ? f.functionName : moduleOf(f.url, root);
    selfMod.set(mod, (selfMod.get(mod) ?? 0) + us);
    // Inclusive: each function on the stack once, however often it recurses.
    const seen = new Set<string>();
    for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) {
      const name = frameName(byId.get(at)!.callFrame, root);
      if (name === '(root)' || seen.has(name)) continue;
      seen.add(name);
      incl.set(name, (incl.get(name) ?? 0) + us);
    }
  }
  return {
    totalMs: total / 1000,
    samples: kept,
    selfByFunction: top(selfFn, total, n),
    selfByModule: top(selfMod, total, n),
    inclusiveByFunction: top(incl, total, n),
  };
}
