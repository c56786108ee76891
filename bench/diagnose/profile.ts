// Where a Sarsen process's own CPU (or memory) goes under load: the compiled build as the image
// runs it, one process against a fresh database, loaded with wrk (non-streaming chat, every body
// distinct) at --concurrency for --seconds after a warm-up. The profiler runs only during the
// measured seconds, started and stopped through the inspector protocol:
//   --mode cpu       V8's sampling CPU profiler: self and inclusive time, in µs a request
//   --mode promoted  V8's sampling heap profiler, keeping what outlived the young generation (what
//                    a full collection later frees included): where what fills the old one is
//                    allocated, in bytes a request
//   --mode alloc     the same keeping everything allocated: where allocation goes, in bytes a request
// Run: node bench/diagnose/profile.ts [--mode cpu --concurrency 16 --seconds 20 --warmup 10 --top 40 --keep FILE]
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { shutdownDatabases } from '../../test/support/db.ts';
import { spawnNode, type SarsenChild } from '../../test/support/child.ts';
import { inspect } from '../../test/support/inspector.ts';
import { createPool } from '../../src/db/pool.ts';
import { benchDatabase } from '../lib/database.ts';
import { startBenchSarsen, SARSEN_RUNTIME_ENV } from '../lib/sarsen-child.ts';
import { provisionChat } from '../lib/provision.ts';
import { runWrk } from '../lib/wrk.ts';
import { treeCpuMs } from '../lib/process-tree.ts';
import { fmt } from '../lib/stats.ts';
import { benchArgs } from '../lib/args.ts';
import { summariseProfile, summariseHeapProfile, type CpuProfile, type HeapProfile } from '../lib/cpu-profile.ts';

const args = benchArgs({
  mode: { type: 'string', default: 'cpu' },
  concurrency: { type: 'string', default: '16' },
  seconds: { type: 'string', default: '20' },
  warmup: { type: 'string', default: '10' },
  top: { type: 'string', default: '40' },
  keep: { type: 'string' },
});
if (!['cpu', 'promoted', 'alloc'].includes(args.mode)) throw new Error('--mode takes cpu, promoted or alloc');
const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const out = (line = '') => process.stdout.write(line + '\n');
const BODY = `{"model":"gpt-bench","messages":[{"role":"user","content":"profile ${Math.random().toString(36).slice(2, 8)} {n}"}]}`;

async function main(): Promise<void> {
  await benchDatabase({ allowNonDurable: false });
  let provider: SarsenChild | null = null;
  const env = { NODE_OPTIONS: `${SARSEN_RUNTIME_ENV.NODE_OPTIONS ?? ''} --inspect=127.0.0.1:0`.trim() };
  const sarsen = await startBenchSarsen({ settings: { shutdown_grace_ms: 5_000 }, env });
  const inspector = await inspect(sarsen.child);
  const pool = createPool(sarsen.db.conn, { max: 2, name: 'sarsen-profile' });
  try {
    provider = spawnNode(path.join(ROOT, 'bench/lib/provider-process.ts'), [], process.env, 'bench provider');
    const [, providerUrl] = await provider.waitFor(/listening (http:\S+)/, 30_000);
    const tenant = await provisionChat(sarsen.url, pool, providerUrl!);
    const load = { url: `${sarsen.url}${tenant.basePath}/chat/completions`, headers: { 'content-type': 'application/json', 'x-sarsen-key': tenant.key }, body: BODY, connections: Number(args.concurrency), timeoutS: 10 };
    await runWrk({ ...load, durationS: Number(args.warmup) });
    const pid = sarsen.child.child.pid!;
    if (args.mode === 'cpu') {
      await inspector.send('Profiler.enable');
      await inspector.send('Profiler.setSamplingInterval', { interval: 500 });
      await inspector.send('Profiler.start');
    } else {
      await inspector.send('HeapProfiler.enable');
      await inspector.send('HeapProfiler.startSampling', { samplingInterval: 4096, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: args.mode === 'alloc' });
    }
    const cpu0 = treeCpuMs(pid);
    const w = await runWrk({ ...load, durationS: Number(args.seconds) });
    const cpuMs = treeCpuMs(pid) - cpu0;
    const stopped = (await inspector.send(args.mode === 'cpu' ? 'Profiler.stop' : 'HeapProfiler.stopSampling')) as { profile: CpuProfile | HeapProfile };
    out(`c=${args.concurrency}: ${w.requests} requests, ${fmt(w.rate, 0)}/s, p50 ${fmt(w.p50Ms, 2)} ms, non-2xx ${w.non2xx}; Sarsen CPU ${fmt((cpuMs * 1000) / w.requests, 0)} µs a request`);
    if (args.keep) fs.writeFileSync(args.keep, JSON.stringify(stopped.profile));
    out(args.mode === 'cpu'
      ? summariseProfile(stopped.profile as CpuProfile, { requests: w.requests, top: Number(args.top) })
      : summariseHeapProfile(stopped.profile as HeapProfile, { requests: w.requests, top: Number(args.top) }));
  } finally {
    inspector.close();
    await pool.end().catch(() => undefined);
    await sarsen.stop();
    if (provider) await provider.kill('SIGTERM').catch(() => undefined);
    await shutdownDatabases();
  }
}

await main();
