// V8's profiles (the inspector's Profiler and HeapProfiler sampling) summarised a request: a CPU
// profile's self time by function and by where the code lives (Sarsen's own files, each package,
// Node's internals), and inclusive time of Sarsen's functions and of the parts a request passes
// through; a heap profile's bytes by allocating function and by its callers.

type CallFrame = { functionName: string; url: string; lineNumber: number; columnNumber: number };
type ProfileNode = { id: number; callFrame: CallFrame; hitCount?: number; children?: number[] };
export type CpuProfile = { nodes: ProfileNode[]; startTime: number; endTime: number; samples: number[]; timeDeltas: number[] };

const where = (url: string): string => {
  if (url === '') return '(native/V8)';
  if (url.startsWith('node:')) return 'node:' + url.slice(5).split('/')[0];
  const nm = url.lastIndexOf('/node_modules/');
  if (nm >= 0) {
    const rest = url.slice(nm + 14).split('/');
    return rest[0]!.startsWith('@') ? `${rest[0]}/${rest[1]}` : rest[0]!;
  }
  const src = url.indexOf('/src/');
  return src >= 0 ? url.slice(src + 1).replace(/\.js$/, '') : url;
};

// Inclusive shares of the parts a request passes through, by where their code lives.
const PARTS: [string, RegExp][] = [
  ['logging (winston, src/log)', /\/(winston|logform|safe-stable-stringify|readable-stream|triple-beam|winston-transport)\/|src\/log\.js/],
  ['metrics (prom-client)', /\/prom-client\/|src\/metrics\//],
  ['express and router', /\/node_modules\/(express|router|body-parser|finalhandler|send|on-finished|content-type|type-is|qs|parseurl|path-to-regexp)\//],
  ['undici', /\/node_modules\/undici\//],
  ['pg', /\/node_modules\/(pg|pg-protocol|pg-pool|pg-types)\//],
  ['zod', /\/node_modules\/zod\//],
  ['OpenTelemetry', /@opentelemetry|src\/telemetry\//],
  ['authentication', /src\/http\/service-auth|src\/core\/api-keys/],
  ['canonical JSON, identity', /src\/core\/canonical-json/],
  ['access log and HTTP metrics (observe)', /src\/http\/observe/],
  ['node http server', /node:_http_server|node:_http_common|node:_http_incoming/],
  ['node http outgoing', /node:_http_outgoing/],
  ['node crypto', /node:internal\/crypto/],
  ['src/db/columns', /src\/db\/columns/],
];

const label = (f: CallFrame) => `${f.functionName || '(anonymous)'} ${where(f.url)}:${f.lineNumber + 1}`;

export function summariseProfile(p: CpuProfile, o: { requests: number; top: number }): string {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const self = new Map<string, number>();
  const pkg = new Map<string, number>();
  const inclusive = new Map<string, number>();
  const parts = new Map<string, number>(PARTS.map(([k]) => [k, 0]));
  let syscalls = 0;
  let total = 0;
  let idle = 0;
  for (let i = 0; i < p.samples.length; i++) {
    // A sample stands for the time until the next one.
    const weight = p.timeDeltas[i + 1] ?? p.timeDeltas[i] ?? 0;
    const node = byId.get(p.samples[i]!)!;
    const name = node.callFrame.functionName;
    if (name === '(idle)') {
      idle += weight;
      continue;
    }
    total += weight;
    const l = name === '(program)' || name === '(garbage collector)' ? name : label(node.callFrame);
    self.set(l, (self.get(l) ?? 0) + weight);
    const w = name === '(program)' || name === '(garbage collector)' ? name : where(node.callFrame.url);
    pkg.set(w, (pkg.get(w) ?? 0) + weight);
    // Inclusive: each distinct frame on the stack once.
    const seen = new Set<string>();
    const urls: string[] = [];
    // The profiler samples wall time: a native socket write's samples are mostly time the kernel
    // spent delivering to the reader on loopback, or this thread waited preempted after waking it
    // (perf puts the process's kernel time at about an eighth of its CPU). Counted apart.
    const syscall = name === 'writev' || name === 'writeBuffer' || name === 'writeUtf8String' || name === 'writeLatin1String';
    if (syscall) syscalls += weight;
    for (let id: number | undefined = node.id; id !== undefined; id = parent.get(id)) {
      const f = byId.get(id)!.callFrame;
      urls.push(f.url);
      if (f.functionName === '(root)') break;
      const fl = label(f);
      if (seen.has(fl)) continue;
      seen.add(fl);
      inclusive.set(fl, (inclusive.get(fl) ?? 0) + weight);
    }
    if (!syscall) for (const [k, re] of PARTS) if (urls.some((u) => re.test(u))) parts.set(k, parts.get(k)! + weight);
  }
  const per = (us: number) => (us / o.requests).toFixed(1).padStart(7);
  const pct = (us: number) => ((100 * us) / total).toFixed(1).padStart(5);
  const lines: string[] = [];
  lines.push(`${((p.endTime - p.startTime) / 1e6).toFixed(1)} s: sampled CPU ${(total / 1e3).toFixed(0)} ms (${per(total).trim()} µs a request), idle ${(idle / 1e3).toFixed(0)} ms`);
  const top = (m: Map<string, number>, n: number, title: string) => {
    lines.push('', `${title}: µs a request, % of sampled CPU`);
    for (const [k, v] of [...m].sort((a, b) => b[1] - a[1]).slice(0, n)) lines.push(`${per(v)} ${pct(v)}%  ${k}`);
  };
  lines.push(`of which native socket writes ${per(syscalls).trim()} µs a request (mostly the kernel delivering to the reader on loopback; excluded from the parts below)`);
  top(parts, PARTS.length, 'inclusive time of the parts a request passes through (native writes excluded)');
  top(pkg, 30, 'self time by where the code lives');
  top(self, o.top, 'self time by function');
  top(new Map([...inclusive].filter(([k]) => /\bsrc\//.test(k))), o.top, "inclusive time of Sarsen's functions");
  top(new Map([...inclusive].filter(([k]) => !/\bsrc\//.test(k))), o.top, 'inclusive time of other functions');
  return lines.join('\n');
}

type HeapNode = { callFrame: CallFrame; selfSize: number; id: number; children: HeapNode[] };
export type HeapProfile = { head: HeapNode; samples: { size: number; nodeId: number; ordinal: number }[] };

/** Bytes a request by allocating function, and by the chain of its three nearest callers. */
export function summariseHeapProfile(p: HeapProfile, o: { requests: number; top: number }): string {
  const self = new Map<string, number>();
  const chains = new Map<string, number>();
  const pkg = new Map<string, number>();
  let total = 0;
  const visit = (n: HeapNode, stack: CallFrame[]) => {
    const here = [n.callFrame, ...stack];
    if (n.selfSize > 0) {
      total += n.selfSize;
      const l = label(n.callFrame);
      self.set(l, (self.get(l) ?? 0) + n.selfSize);
      const c = here.slice(0, 4).map(label).join(' <- ');
      chains.set(c, (chains.get(c) ?? 0) + n.selfSize);
      const w = where(n.callFrame.url);
      pkg.set(w, (pkg.get(w) ?? 0) + n.selfSize);
    }
    for (const c of n.children) visit(c, here);
  };
  visit(p.head, []);
  const per = (b: number) => (b / o.requests).toFixed(0).padStart(7);
  const lines = [`sampled ${(total / 1048576).toFixed(1)} MB, ${per(total).trim()} bytes a request`];
  const top = (m: Map<string, number>, n: number, title: string) => {
    lines.push('', `${title}: bytes a request`);
    for (const [k, v] of [...m].sort((a, b) => b[1] - a[1]).slice(0, n)) lines.push(`${per(v)}  ${k}`);
  };
  top(pkg, 25, 'by where the allocating code lives');
  top(self, o.top, 'by allocating function');
  top(chains, o.top, 'by allocating function and its callers');
  return lines.join('\n');
}
