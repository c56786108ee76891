// The Node runtime settings every way of starting Sarsen uses (bin/sarsen.js applies them: npm
// start, npm run sarsen, the image), decided from the memory the process may use.
//
// - MALLOC_ARENA_MAX=2: left alone, glibc gives every thread its own malloc arena.
// - --max-semi-space-size=16: left alone, V8 sizes its young generation for the machine.
// - --max-old-space-size: V8's heap limit. With no memory limit (or a large one) it is 1024 MB:
//   below 2 GB V8 lets the old generation grow to at most 1.6 times what survived its last
//   collection instead of 4 times, so garbage is collected sooner. Under a container's limit it
//   is half of that limit (at most 1024 MB): V8's own default under a cgroup limit can exceed a
//   small limit (docs/measurements.md "Memory"), and the other half is for what lives outside V8's
//   heap (Buffers of bodies and frames, sockets' buffers, the runtime's own code).
// An operator's own flag for either heap size (in NODE_OPTIONS or on the command line) wins.

const MB = 1024 * 1024;
export const HEAP_CAP_MB = 1024;
const HEAP_FLOOR_MB = 64;
const SEMI_SPACE_MB = 16;

/** The memory limit the process runs under, in bytes, or null (none, or none below the machine's memory). */
export function memoryLimit(constrained: number | undefined, total: number): number | null {
  return constrained !== undefined && constrained > 0 && constrained < total ? constrained : null;
}

/** V8's old-generation limit for a memory limit (null: none) shared by `processes` Node processes. */
export function oldSpaceMb(limitBytes: number | null, processes = 1): number {
  if (limitBytes === null) return HEAP_CAP_MB;
  return Math.max(HEAP_FLOOR_MB, Math.min(HEAP_CAP_MB, Math.floor(limitBytes / MB / 2 / processes)));
}

/**
 * The flags for the workers of `serve --processes N`: they share the container with each other,
 * so the heap limit the launcher chose for one process (`applied`, its flags) is split N ways.
 * An operator's own heap flag is left as given.
 */
export function workerExecArgv(execArgv: readonly string[], applied: string, limitBytes: number | null, processes: number): string[] {
  if (!applied.split(' ').some((f) => f.startsWith('--max-old-space-size='))) return [...execArgv];
  const own = `--max-old-space-size=${oldSpaceMb(limitBytes, processes)}`;
  return execArgv.map((f) => (f.replaceAll('_', '-').startsWith('--max-old-space-size=') ? own : f));
}

export type RuntimeSettings = { flags: string[]; env: Record<string, string> };

/**
 * The Node flags and environment to start Sarsen with. `given`: the flags already in effect
 * (the command line's and NODE_OPTIONS'), `env`: the environment it was started with.
 */
export function runtimeSettings(m: { constrained: number | undefined; total: number; given: readonly string[]; env: Readonly<Record<string, string | undefined>> }): RuntimeSettings {
  // V8 reads `_` and `-` alike in its flags' names.
  const has = (flag: string) => m.given.map((g) => g.replaceAll('_', '-')).some((g) => g === flag || g.startsWith(`${flag}=`));
  const flags: string[] = [];
  if (!has('--max-semi-space-size')) flags.push(`--max-semi-space-size=${SEMI_SPACE_MB}`);
  if (!has('--max-old-space-size')) flags.push(`--max-old-space-size=${oldSpaceMb(memoryLimit(m.constrained, m.total))}`);
  return { flags, env: m.env.MALLOC_ARENA_MAX === undefined ? { MALLOC_ARENA_MAX: '2' } : {} };
}
