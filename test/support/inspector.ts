// The live heap of a child Node process, after a full garbage collection, read through the
// inspector protocol: RSS says what the process holds from the system (V8 and the allocator
// keep freed memory for reuse), the collected heap says what its objects still hold. The child
// must run with `--inspect=127.0.0.1:0`; its output names the debugger's address.
import type { SarsenChild } from './child.ts';

export type Inspector = {
  /** Collects garbage (twice, so that what finalizers freed goes too) and answers the heap's and external (Buffer) bytes in MB. */
  collectedHeapMb(): Promise<{ heap: number; external: number }>;
  /** One method of the inspector protocol (Profiler.start, HeapProfiler.startSampling, ...): its result. */
  send(method: string, params?: object): Promise<unknown>;
  close(): void;
};

export async function inspect(child: SarsenChild): Promise<Inspector> {
  const [, url] = await child.waitFor(/Debugger listening on (ws:\/\/\S+)/);
  const ws = new WebSocket(url!);
  await new Promise<void>((resolve, reject) => {
    ws.addEventListener('open', () => resolve(), { once: true });
    ws.addEventListener('error', () => reject(new Error(`cannot reach the inspector at ${url}`)), { once: true });
  });
  let next = 0;
  const pending = new Map<number, (result: unknown) => void>();
  ws.addEventListener('message', (m) => {
    const msg = JSON.parse(String(m.data)) as { id?: number; result?: unknown };
    if (msg.id !== undefined) pending.get(msg.id)?.(msg.result);
  });
  const send = (method: string, params: object = {}): Promise<unknown> =>
    new Promise((resolve) => {
      const id = ++next;
      pending.set(id, resolve);
      ws.send(JSON.stringify({ id, method, params }));
    });
  return {
    async collectedHeapMb() {
      await send('HeapProfiler.collectGarbage');
      await send('HeapProfiler.collectGarbage');
      const { result } = (await send('Runtime.evaluate', { expression: 'JSON.stringify(process.memoryUsage())', returnByValue: true })) as { result: { value: string } };
      const usage = JSON.parse(result.value) as NodeJS.MemoryUsage;
      return { heap: usage.heapUsed / 1048576, external: usage.external / 1048576 };
    },
    send,
    close: () => ws.close(),
  };
}
