// The serving process gives back what a burst took once it goes quiet (the decision is
// src/core/idle-collection.ts): a sample a second, and a full collection when the process
// grew and its event loop is idle, soon after callers leave.
import v8 from 'node:v8';
import vm from 'node:vm';
import { createIdleCollection } from './core/idle-collection.ts';

const SAMPLE_MS = 1_000;
const OPTIONS = { growthBytes: 16 * 1024 * 1024, idleUtilization: 0.05, busyUtilization: 0.25, firstDelayMs: 10_000, maxDelayMs: 300_000 };

/** Starts sampling; `httpConnections` answers the HTTP connections open now. `stop()` ends it. */
export function startIdleCollector(httpConnections: () => number): { stop(): void } {
  const collect = collector();
  const decide = createIdleCollection(OPTIONS);
  let last = performance.eventLoopUtilization();
  const timer = setInterval(() => {
    const now = performance.eventLoopUtilization();
    const { utilization } = performance.eventLoopUtilization(now, last);
    last = now;
    // The collection V8 makes under memory pressure: it also shrinks the young generation and
    // unmaps freed pages. A plain one leaves that to V8's memory reducer, which after a few
    // bursts of the same size stops following up (docs/measurements.md "Memory"). It pauses the
    // process for some 50-75 ms, and runs only while it is idle.
    if (decide.sample(Date.now(), process.memoryUsage.rss(), utilization, httpConnections())) collect({ type: 'major', execution: 'sync', flavor: 'last-resort' });
  }, SAMPLE_MS);
  timer.unref();
  return { stop: () => clearInterval(timer) };
}

/** V8's `gc`: the global one when Node was started with --expose-gc, else one from a context made with it. */
function collector(): NodeJS.GCFunction {
  if (globalThis.gc) return globalThis.gc;
  v8.setFlagsFromString('--expose-gc');
  const gc = vm.runInNewContext('gc') as NodeJS.GCFunction;
  v8.setFlagsFromString('--no-expose-gc'); // that one context only
  return gc;
}
