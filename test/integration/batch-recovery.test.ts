// A batch survives worker death (issue 43): real `sarsen` processes, executors SIGKILLed again and
// again while a batch of 2,000 lines runs (docs/api.md "Batches"). Every line ends exactly once,
// and the provider was called once per line plus at most once per recovery.
import { expect } from 'chai';
import OpenAI, { toFile } from 'openai';
import { startFakeProvider, chatCompletionBody, type FakeProvider, type JournalEntry } from '../support/fake-provider.ts';
import { provision } from '../support/tenant.ts';
import { startDeployment, type Deployment, type SarsenProcess } from '../support/processes.ts';
import { until } from '../support/http.ts';

const LINES = 2000;
const KILL_EVERY_MS = 1000;

describe('a batch through executor deaths', function () {
  this.timeout(300_000);
  let provider: FakeProvider;
  let d: Deployment;

  before(async () => {
    provider = await startFakeProvider();
    d = await startDeployment({ sweep_interval_ms: 100, lease_ms: 3000, heartbeat_ms: 500, retry_base_ms: 20, retry_max_ms: 100, batch_lines_in_flight: 32 });
  });
  after(async () => {
    await d?.close();
    await provider?.close();
  });

  it(`executors SIGKILLed every ${KILL_EVERY_MS / 1000} s through ${LINES} lines: every line ends exactly once, provider calls are lines plus recoveries`, async () => {
    const started = performance.now();
    const api = await d.start('api');
    let executors: SarsenProcess[] = [await d.start('executor'), await d.start('executor')];
    const t = await provision(d.asServer(api), provider);
    const m = `kill-${process.pid}`;
    const contentOf = (e: JournalEntry) => e.json?.messages?.[0]?.content as string | undefined;
    // Slow enough that kills land while calls are in flight.
    provider.rule((e) => (contentOf(e)?.startsWith(m) ? { kind: 'json', body: chatCompletionBody(`answer ${contentOf(e)}`), delayMs: 150 } : undefined));

    const client = new OpenAI({ baseURL: t.base, apiKey: t.key, maxRetries: 0 });
    const input = Array.from({ length: LINES }, (_, i) =>
      JSON.stringify({ custom_id: `line-${i}`, method: 'POST', url: '/v1/chat/completions', body: { model: 'gpt-test', messages: [{ role: 'user', content: `${m}-${i}` }] } }),
    ).join('\n');
    const file = await client.files.create({ file: await toFile(Buffer.from(input), 'kill.jsonl'), purpose: 'batch' });
    const batch = await client.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });

    let kills = 0;
    try {
      for (;;) {
        await new Promise((r) => setTimeout(r, KILL_EVERY_MS));
        const now = await client.batches.retrieve(batch.id);
        if (now.status !== 'in_progress') break;
        // A replacement first, so the batch always has an executor.
        const fresh = await d.start('executor');
        // The one running the most attempts, so that the kill lands on work in flight (the oldest
        // when none runs any).
        const { rows: holders } = await d.pool.query<{ owner: string }>(
          `SELECT lease_owner AS owner FROM sarsen.requests WHERE status = 'running' AND lease_owner IS NOT NULL GROUP BY lease_owner ORDER BY count(*) DESC`,
        );
        const victim = holders.map((h) => executors.find((e) => e.owner === h.owner)).find((e) => e !== undefined) ?? executors[0]!;
        await victim.kill('SIGKILL');
        kills++;
        executors = [...executors.filter((e) => e !== victim), fresh];
      }
      const done = await until(async () => {
        const b = await client.batches.retrieve(batch.id);
        return b.status === 'completed' ? b : undefined;
      }, 120_000, 250);

      const output = Buffer.from(await (await client.files.content(done.output_file_id!)).arrayBuffer()).toString('utf8');
      const results = output.split('\n').filter(Boolean).map((l) => JSON.parse(l) as { custom_id: string; response: { status_code: number; request_id: string } });
      const ids = results.map((r) => r.custom_id);
      const requests = results.map((r) => r.response.request_id);
      const { rows } = await d.pool.query<{ recoveries: number; attempts: number }>(
        `SELECT coalesce(sum(recoveries), 0)::int AS recoveries, coalesce(sum(attempts), 0)::int AS attempts FROM sarsen.requests WHERE id = ANY($1)`,
        [requests],
      );
      const recoveries = rows[0]!.recoveries;
      const calls = provider.journal.filter((e) => contentOf(e)?.startsWith(m));
      const seconds = ((performance.now() - started) / 1000).toFixed(1);
      console.log(`      ${LINES} lines in ${seconds} s; ${kills} executors killed; ${recoveries} recoveries; ${calls.length} provider calls`);

      expect(kills).to.be.at.least(3);
      expect(done.request_counts).to.deep.equal({ total: LINES, completed: LINES, failed: 0 });
      expect(new Set(ids).size).to.equal(LINES);
      expect(ids).to.have.length(LINES);
      expect(results.every((r) => r.response.status_code === 200)).to.equal(true);
      // One request per line: no line ran as two.
      expect(new Set(requests).size).to.equal(LINES);
      // Every line reached the provider; beyond one call each, only recoveries called again. A
      // kill between an attempt's claim and its call recovers without a call, hence at most.
      const perLine = new Map<string, number>();
      for (const c of calls) perLine.set(contentOf(c)!, (perLine.get(contentOf(c)!) ?? 0) + 1);
      expect(perLine.size).to.equal(LINES);
      expect(calls.length).to.be.at.least(LINES);
      expect(calls.length).to.be.at.most(LINES + recoveries);
      expect(recoveries).to.be.greaterThan(0);
      expect(api.child.exitCode, api.output().slice(-2000)).to.equal(null);
    } finally {
      for (const p of [api, ...executors]) await p.kill('SIGKILL');
    }
  });
});
