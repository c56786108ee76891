// durableFetch across processes (docs/clients.md "Durable fetch"): the Sarsen process serving a
// stream to the unmodified openai client is SIGKILLed mid-stream; the caller's load balancer (a
// TCP forwarder here, trying each api process in turn) hands the resume to a second process, and
// the executor process goes on producing. The SDK sees one stream, byte for byte, and the
// provider one call.
import { expect } from 'chai';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import { durableFetch, type ResumeInfo } from 'sarsen/client';
import { startFakeProvider, chatFrames, type FakeProvider } from '../support/fake-provider.ts';
import { provision, type Tenant } from '../support/tenant.ts';
import { startDeployment, type Deployment, type SarsenProcess } from '../support/processes.ts';
import { track } from '../support/resources.ts';
import { gate } from './streaming-support.ts';

/** Forwards each connection to the first of `targets` that accepts it, as a load balancer with health checks would. */
async function startBalancer(targets: () => { host: string; port: number }[]): Promise<{ port: number; close(): Promise<void> }> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    sockets.add(client);
    client.on('close', () => sockets.delete(client));
    client.on('error', () => {});
    client.pause();
    const tryNext = (i: number) => {
      const target = targets()[i];
      if (!target) return void client.destroy();
      const upstream = net.connect(target.port, target.host);
      let connected = false;
      upstream.once('error', () => {
        upstream.destroy();
        if (!connected) tryNext(i + 1);
      });
      upstream.once('connect', () => {
        connected = true;
        sockets.add(upstream);
        upstream.on('close', () => {
          sockets.delete(upstream);
          client.destroy();
        });
        upstream.on('error', () => client.destroy());
        client.on('close', () => upstream.destroy());
        client.pipe(upstream);
        upstream.pipe(client);
        client.resume();
      });
    };
    tryNext(0);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  const untrack = track('server', `balancer :${port}`);
  return {
    port,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
      untrack();
    },
  };
}

describe('durableFetch: the serving process SIGKILLed mid-stream', function () {
  this.timeout(180_000);
  let provider: FakeProvider;
  let d: Deployment;
  let first: SarsenProcess;
  let second: SarsenProcess;
  let executor: SarsenProcess;
  let balancer: Awaited<ReturnType<typeof startBalancer>>;
  let t: Tenant;

  before(async () => {
    provider = await startFakeProvider();
    d = await startDeployment();
    [first, second, executor] = await Promise.all([d.start('api'), d.start('api'), d.start('executor')]);
    t = await provision(d.asServer(first), provider);
    const target = (p: SarsenProcess) => ({ host: '127.0.0.1', port: Number(new URL(p.url).port) });
    balancer = await startBalancer(() => [first, second].map(target));
  });
  after(async () => {
    await balancer?.close();
    for (const p of [second, executor]) {
      if (!p) continue;
      const { code } = await p.kill('SIGTERM');
      expect(code, p.output()).to.equal(0);
    }
    await d?.close();
    await provider?.close();
  });

  it('the second process serves the resume: every frame once, byte for byte, and one provider call', async () => {
    const texts = Array.from({ length: 20 }, (_, i) => `k${i} `);
    const frames = chatFrames(texts);
    const gates = frames.map(() => gate());
    provider.enqueue({ kind: 'sse', frames, waitBefore: Object.fromEntries(gates.map((g, i) => [i, g.until])) });
    const resumes: ResumeInfo[] = [];
    const bytes: Buffer[] = [];
    const durable = durableFetch({ backoffMs: 50, maxBackoffMs: 500, stallMs: 5000, onResume: (r) => void resumes.push(r) });
    const recorded = async (input: Parameters<typeof fetch>[0], init?: RequestInit) => {
      const res = await durable(input, init);
      const [a, b] = res.body!.tee();
      void (async () => {
        for await (const c of b) bytes.push(Buffer.from(c));
      })().catch(() => {});
      return new Response(a, { status: res.status, headers: res.headers });
    };
    const base = t.base.replace(new URL(first.url).origin, `http://127.0.0.1:${balancer.port}`);
    const client = new OpenAI({ baseURL: base, apiKey: t.key, fetch: recorded as typeof fetch, maxRetries: 0 });
    gates[0]!.open();
    const stream = await client.chat.completions.create({ model: 'gpt-test', stream: true, messages: [{ role: 'user', content: 'kill the server' }] });
    let n = 0;
    let text = '';
    for await (const chunk of stream) {
      n++;
      text += chunk.choices[0]?.delta?.content ?? '';
      if (n === 7) await first.kill('SIGKILL');
      gates[n]?.open();
    }
    expect(text).to.equal(texts.join(''));
    expect(Buffer.concat(bytes).toString('latin1')).to.equal(frames.join(''));
    expect(provider.journal.length).to.equal(1);
    expect(resumes.some((r) => r.how === 'replay')).to.equal(true);
    // The executor process ran it once: no recovery, no second attempt.
    const { rows } = await d.pool.query(`SELECT attempts, recoveries, status FROM sarsen.requests`);
    expect(rows).to.deep.equal([{ attempts: 1, recoveries: 0, status: 'succeeded' }]);
  });
});
