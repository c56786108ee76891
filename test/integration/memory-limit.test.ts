// Inside a container's memory (issue 29): `sarsen` started the way the image and npm start it
// (bin/sarsen.js) inside a memory cgroup limited to 512 MB, the kernel's own limit, which kills
// the process should it go past. It sizes its heap from that limit, then runs a mixed soak and
// 1,000 streams held open at once, and is not killed. The cgroup is made under this process's
// own (cgroup v1 `memory.limit_in_bytes`, or v2 `memory.max`); that needs root, and a machine
// where it cannot be made fails this test, saying why.
import { expect } from 'chai';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { startDeployment, type Deployment } from '../support/processes.ts';
import { sarsenEnv, spawnProcess, type SarsenChild } from '../support/child.ts';
import { call } from '../support/control-plane.ts';
import { recordingProvider, submitMixed, expectNothingLost, settled } from '../support/chaos.ts';
import { openStream } from './streaming-support.ts';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const LIMIT = 512 * 1024 * 1024;
const STREAMS = 1000;
const KEEP_ALIVE = ': keep-alive\n\n';

describe('under a 512 MB memory limit', function () {
  this.timeout(300_000);
  let provider: FakeProvider;
  let gated: GatedProvider;
  let d: Deployment;
  let group: MemoryCgroup;

  before(async () => {
    group = memoryCgroup(LIMIT); // throws, failing the suite, where the machine does not allow it
    provider = await startFakeProvider();
    gated = await startGatedProvider(STREAMS);
    d = await startDeployment();
  });
  after(async () => {
    await d?.close();
    await gated?.close();
    await provider?.close();
    group?.remove();
  });

  it('sizes its heap from the limit, runs a mixed soak and 1,000 streams at once, and is not killed', async () => {
    // As the image starts it: the launcher, in the cgroup from its first instruction.
    const command = `echo $$ > '${group.procs}' && exec '${process.execPath}' bin/sarsen.js --role both --port 0`;
    const sarsen = spawnProcess('sh', ['-c', command], { cwd: ROOT, env: sarsenEnv(d.db.conn, d.secrets.dir), label: 'sarsen in a memory cgroup' });
    try {
      await underLoad(sarsen);
    } finally {
      await sarsen.kill('SIGKILL');
    }
  });

  async function underLoad(sarsen: SarsenChild): Promise<void> {
    const [, url] = await sarsen.waitFor(/"url":"(http:[^"]+)"/, 60_000);
    const pid = sarsen.child.pid!;
    const cmdline = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    expect(cmdline, 'the heap limit bin/sarsen.js chose').to.include('--max-old-space-size=256');
    const t = await provision({ url, pool: d.pool, db: d.db } as never, provider);

    // A mixed soak: streams and answers through POST /requests, every one checked byte for byte.
    const answers = recordingProvider(provider);
    const { ok, refused } = await submitMixed(t, 400, 16, 'mem');
    expect(refused).to.equal(0);
    await settled(d.pool, ok.map((s) => s.id), 120_000);
    await expectNothingLost(d.pool, t, ok, answers);

    // 1,000 live streams held open at once: the provider sends each its first frame and the
    // rest only once all 1,000 are connected.
    await routeTo(url, t, gated.url);
    const streams = Array.from({ length: STREAMS }, (_, i) =>
      openStream(`${t.base}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-sarsen-key': t.key },
        body: JSON.stringify({ model: 'gated-test', stream: true, messages: [{ role: 'user', content: `live-${i}` }] }),
      }),
    );
    const results = await Promise.all(streams.map((s) => s.done));
    expect(gated.heldAtOnce(), 'provider streams held open at once').to.equal(STREAMS);
    for (const [i, r] of results.entries()) {
      expect(r.status, `stream ${i}`).to.equal(200);
      // A stream left quiet for 15 s while a loaded machine connects the other 999 gets Sarsen's
      // keep-alive comment (docs/api.md): bytes of Sarsen's own, not the provider's, so not compared.
      expect(r.body.toString('utf8').replaceAll(KEEP_ALIVE, ''), `stream ${i}`).to.equal(gated.answer(`live-${i}`));
    }

    const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    const peakRssMb = Number(/VmHWM:\s+(\d+) kB/.exec(status)![1]) / 1024;
    expect(sarsen.child.exitCode, sarsen.output().slice(-2000)).to.equal(null);
    expect(sarsen.child.signalCode).to.equal(null);
    expect(group.oomKills(), 'processes the kernel killed in the cgroup').to.equal(0);
    process.stderr.write(
      `      (cgroup v${group.version} limit 512 MB; ${cmdline.filter((a) => a.startsWith('--max')).join(' ')}; ${ok.length} soak requests, ${STREAMS} streams at once; ` +
        `peak RSS ${peakRssMb.toFixed(0)} MB, cgroup peak ${(group.peakBytes() / 1024 / 1024).toFixed(0)} MB)\n`,
    );
    const exit = await sarsen.kill('SIGTERM');
    expect(exit.code, sarsen.output().slice(-2000)).to.equal(0);
  }
});

type MemoryCgroup = { version: 1 | 2; procs: string; peakBytes(): number; oomKills(): number; remove(): void };

/** A memory cgroup limited to `bytes`, made under this process's own; throws saying why it cannot be. */
function memoryCgroup(bytes: number): MemoryCgroup {
  const lines = fs.readFileSync('/proc/self/cgroup', 'utf8').trim().split('\n').map((l) => l.split(':'));
  const v1 = lines.find(([, controllers]) => controllers!.split(',').includes('memory'));
  const name = `sarsen-test-${process.pid}-${Date.now()}`;
  try {
    if (v1 && fs.existsSync('/sys/fs/cgroup/memory')) {
      const mounted = path.join('/sys/fs/cgroup/memory', v1[2]!);
      const dir = path.join(fs.existsSync(mounted) ? mounted : '/sys/fs/cgroup/memory', name);
      fs.mkdirSync(dir);
      fs.writeFileSync(path.join(dir, 'memory.limit_in_bytes'), String(bytes));
      // Without swap accounting limited too, the limit could be escaped into swap.
      if (fs.existsSync(path.join(dir, 'memory.memsw.limit_in_bytes'))) fs.writeFileSync(path.join(dir, 'memory.memsw.limit_in_bytes'), String(bytes));
      const read = (file: string) => fs.readFileSync(path.join(dir, file), 'utf8');
      return {
        version: 1,
        procs: path.join(dir, 'cgroup.procs'),
        peakBytes: () => Number(read('memory.max_usage_in_bytes')),
        oomKills: () => Number(/oom_kill (\d+)/.exec(read('memory.oom_control'))?.[1] ?? 0),
        remove: () => fs.rmdirSync(dir),
      };
    }
    const v2 = lines.find(([id]) => id === '0');
    if (!v2 || !fs.existsSync('/sys/fs/cgroup/cgroup.controllers')) throw new Error('no cgroup memory controller is mounted');
    const dir = path.join('/sys/fs/cgroup', v2[2]!, name);
    fs.mkdirSync(dir);
    fs.writeFileSync(path.join(dir, 'memory.max'), String(bytes));
    fs.writeFileSync(path.join(dir, 'memory.swap.max'), '0');
    const read = (file: string) => fs.readFileSync(path.join(dir, file), 'utf8');
    return {
      version: 2,
      procs: path.join(dir, 'cgroup.procs'),
      peakBytes: () => Number(read('memory.peak')),
      oomKills: () => Number(/oom_kill (\d+)/.exec(read('memory.events'))?.[1] ?? 0),
      remove: () => fs.rmdirSync(dir),
    };
  } catch (err) {
    throw new Error(
      `this test needs a memory cgroup it can limit to ${bytes} bytes (root, with the cgroup v1 memory controller or cgroup v2 ` +
        `with memory delegated); it could not make one: ${(err as Error).message}`,
    );
  }
}

type GatedProvider = { url: string; heldAtOnce(): number; answer(marker: string): string; close(): Promise<void> };

/** A chat provider that sends each stream its first frame at once and the rest once `gate` streams are open. */
async function startGatedProvider(gate: number): Promise<GatedProvider> {
  const sent = new Map<string, string[]>();
  const frames = (marker: string) => {
    if (!sent.has(marker)) sent.set(marker, chatFrames(Array.from({ length: 10 }, (_, i) => `${marker}/${i} `)));
    return sent.get(marker)!;
  };
  let waiting: (() => void)[] = [];
  let open = 0;
  let heldAtOnce = 0;
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const marker = JSON.parse(Buffer.concat(chunks).toString('utf8')).messages[0].content as string;
      const [first, ...rest] = frames(marker);
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(first);
      open++;
      heldAtOnce = Math.max(heldAtOnce, open);
      res.on('close', () => open--);
      waiting.push(async () => {
        for (const frame of rest) {
          await new Promise((r) => setTimeout(r, 50));
          res.write(frame);
        }
        res.end();
      });
      if (waiting.length === gate) {
        const all = waiting;
        waiting = [];
        for (const go of all) go();
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    heldAtOnce: () => heldAtOnce,
    answer: (marker) => sent.get(marker)?.join('') ?? '(never asked)',
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

/** Routes model `gated-*` of the tenant's namespace to a chat backend at `address`. */
async function routeTo(url: string, t: Tenant, address: string): Promise<void> {
  const ns = `/${t.tenancy}/v1/namespaces/${t.namespace}`;
  const backend = await call(url, 'POST', `${ns}/backends`, { token: t.adminToken, body: { name: 'gated', kind: 'chat_compat', address: `${address}/v1`, credential: 'sk-gated-provider' } });
  expect(backend.status, backend.text).to.equal(201);
  const rule = await call(url, 'POST', `${ns}/routing-rules`, { token: t.adminToken, body: { model: 'gated-*', backend_id: backend.body.backend_id } });
  expect(rule.status, rule.text).to.equal(201);
}
