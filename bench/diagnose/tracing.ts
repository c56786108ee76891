// What tracing costs a request, in isolation (docs/measurements.md "Costs measured in isolation"):
// the CPU one process spends on the spans one non-streaming request makes (the caller's request,
// acceptance with its group commit, the attempt, the provider call with its GenAI attributes read
// from a real answer, settlement), sampled at 100% and exported over OTLP/HTTP to a sink that keeps
// nothing, against the same work with tracing off (one variable tested per call site).
//
//   node bench/diagnose/tracing.ts [--requests 20000 --protocol http/protobuf]
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { benchArgs } from '../lib/args.ts';
import { readTracing } from '../../src/config/config.ts';

const args = benchArgs({
  requests: { type: 'string', default: '20000' },
  rounds: { type: 'string', default: '3' },
  protocol: { type: 'string', default: 'http/protobuf' },
});
const N = Number(args.requests);

// The sink: takes every export, keeps nothing.
let exported = 0;
const sink = http.createServer((req, res) => {
  req.on('data', (c: Buffer) => (exported += c.length));
  req.on('end', () => res.writeHead(200).end());
});
await new Promise<void>((resolve) => sink.listen(0, '127.0.0.1', resolve));
const endpoint = `http://127.0.0.1:${(sink.address() as AddressInfo).port}`;

const tracing = await import('../../src/telemetry/tracing.ts');
const spans = await import('../../src/telemetry/spans.ts');
const { trace, context, SpanKind } = await import('@opentelemetry/api');
const answer = Buffer.from(JSON.stringify({
  id: 'chatcmpl-bench', object: 'chat.completion', created: 0, model: 'gpt-bench',
  choices: [{ index: 0, message: { role: 'assistant', content: 'a short answer of a few words' }, finish_reason: 'stop' }],
  usage: { prompt_tokens: 12, completion_tokens: 7, total_tokens: 19 },
}));

/** The tracing work of one request, as the call sites do it; off, each tests `tracer` and moves on. */
async function oneRequest(i: number): Promise<void> {
  const t = tracing.tracer;
  const id = `req_${i}`;
  const work = async () => ({ requestId: id, attached: false, cachedFrom: null });
  if (t === null) {
    await work();
    return;
  }
  const server = t.startSpan('POST', { kind: SpanKind.SERVER, attributes: { 'http.request.method': 'POST', 'url.path': '/t/n/v1/chat/completions', 'url.scheme': 'http' } });
  await context.with(trace.setSpan(context.active(), server), async () => {
    const parent = spans.currentTraceParent();
    await spans.traceAcceptance(t, id, 'chat', false, () => spans.tracedFlush('accept:', [id], 0, work));
    await spans.traceAttempt(t, { id, attempt: 1, namespaceId: 'ns_bench', dialect: 'chat', streaming: false, recoveries: 0, traceParent: parent }, async () => {
      await spans.traceProviderCall(t, { dialect: 'chat', backendDialect: 'chat', model: 'gpt-bench', address: 'http://127.0.0.1:9/v1' }, async (call) => {
        call.answered(200);
        call.answer(answer);
        call.tokens(12, 7);
      });
      spans.attemptEnded('succeeded');
      await spans.traceSettle(t, id, 'succeeded', () => spans.tracedFlush('settle:', [id], 0, work));
    });
  });
  for (const [k, v] of Object.entries({ 'http.route': '/:tenancy/:namespace/v1/chat/completions', 'http.response.status_code': 200, 'sarsen.request.id': id, 'sarsen.attached': false, 'sarsen.cache.hit': false, 'sarsen.namespace': 'main', 'sarsen.key.prefix': 'abcdefgh', 'sarsen.dialect': 'chat', 'sarsen.rate_limit': 'none' })) server.setAttribute(k, v);
  server.end();
}

// The export's own CPU is counted with the requests that made it: each round ends once all is sent.
const flush = () => (trace.getTracerProvider() as unknown as { getDelegate(): { forceFlush?(): Promise<void> } }).getDelegate().forceFlush?.();

async function run(): Promise<number> {
  const before = process.cpuUsage();
  for (let i = 0; i < N; i++) {
    await oneRequest(i);
    // Exported in batches of 384 spans as they come, so none is dropped from a full queue (a
    // dropped span would cost nothing to export).
    if (i % 64 === 63) await flush();
  }
  await flush();
  const { user, system } = process.cpuUsage(before);
  return (user + system) / N; // µs of CPU a request
}

const off: number[] = [];
for (let r = 0; r < Number(args.rounds); r++) off.push(await run());
const { startTracing } = await import('../../src/telemetry/setup.ts');
// The exporter reads its endpoint from the environment itself, as it does in Sarsen.
process.env.OTEL_EXPORTER_OTLP_ENDPOINT = endpoint;
await startTracing(readTracing({ OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_EXPORTER_OTLP_PROTOCOL: args.protocol, OTEL_TRACES_SAMPLER: 'always_on' }), 'bench');
const on: number[] = [];
for (let r = 0; r < Number(args.rounds); r++) on.push(await run());
await tracing.flushTracing();
sink.close();
const fmt = (xs: number[]) => xs.map((x) => x.toFixed(1)).join(', ');
process.stdout.write(`tracing cost per request (µs of CPU, ${N} requests a round, ${args.protocol}):\n  off: ${fmt(off)}\n  on, 100% sampled and exported: ${fmt(on)}\n  exported ${(exported / 1024 / 1024).toFixed(1)} MiB (${(exported / N / Number(args.rounds)).toFixed(0)} bytes a request)\n`);
