// The pauses of a traced process's event loop, as spans (docs/operations.md "Tracing"): a garbage
// collection of GC_MS or more is a `sarsen.gc` span, a turn of the loop late by STALL_MS or more a
// `sarsen.event_loop.stall`, each a root span of its own with the pause's own start and end. A
// request that took long finds, by time and process.pid, what held its process meanwhile.
// Started only when tracing is on.
import { PerformanceObserver, constants } from 'node:perf_hooks';
import { ROOT_CONTEXT, type Tracer } from '@opentelemetry/api';

// Shorter pauses are part of every request's ordinary cost, not an explanation of a slow one.
const GC_MS = 5;
const STALL_TICK_MS = 10;
const STALL_MS = 20;

const KINDS: Record<number, string> = {
  [constants.NODE_PERFORMANCE_GC_MINOR]: 'minor',
  [constants.NODE_PERFORMANCE_GC_MAJOR]: 'major',
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incremental',
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weakcb',
};

/** Epoch ms of a performance.now() reading: the clock spans are stamped with. */
const epoch = (at: number): number => performance.timeOrigin + at;

function pause(tracer: Tracer, name: string, start: number, ms: number, attributes: Record<string, string | number>): void {
  tracer.startSpan(name, { startTime: epoch(start), attributes: { ...attributes, 'sarsen.pause_ms': Math.round(ms * 1000) / 1000 } }, ROOT_CONTEXT).end(epoch(start + ms));
}

/** Watches this process's pauses for as long as it runs; returns how to stop. */
export function watchPauses(tracer: Tracer): () => void {
  const gc = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      if (e.duration < GC_MS) continue;
      const kind = KINDS[(e as { detail?: { kind?: number } }).detail?.kind ?? -1] ?? 'other';
      pause(tracer, 'sarsen.gc', e.startTime, e.duration, { 'sarsen.gc.kind': kind });
    }
  });
  gc.observe({ entryTypes: ['gc'] });
  let last = performance.now();
  const ticker = setInterval(() => {
    const now = performance.now();
    const late = now - last - STALL_TICK_MS;
    if (late >= STALL_MS) pause(tracer, 'sarsen.event_loop.stall', last + STALL_TICK_MS, late, {});
    last = now;
  }, STALL_TICK_MS).unref();
  return () => {
    gc.disconnect();
    clearInterval(ticker);
  };
}
