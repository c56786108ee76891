// Draws one request's traces as a trace viewer's waterfall, from spans Sarsen really exported,
// and screenshots it with headless Chromium for docs/operations.md "Tracing". Not Jaeger or
// Tempo: an HTML page of our own, laid out the way they lay a trace out (a row per span,
// indented under its parent, a bar on one time axis, events as marks, links named).
//
//   SARSEN_OTEL_DUMP=/tmp/spans.json npx mocha test/integration/otel.test.ts
//   node bench/trace-waterfall.ts /tmp/spans.json docs/trace-waterfall.png
//
// It draws the request the test recovered after SIGKILLing its executor: the trace its
// submission started, and the trace of the attempt that recovered it, linked to the first.
import fs from 'node:fs';
import { launchBrowser } from '../test/support/browser.ts';

type Span = {
  traceId: string; spanId: string; parentSpanId: string; name: string; kind: number; status: number;
  attributes: Record<string, unknown>; events: { name: string }[]; links: { traceId: string; spanId: string; attributes: Record<string, unknown> }[];
  resource: Record<string, unknown>; startNs: string; endNs: string;
};

const [input, output] = process.argv.slice(2);
if (!input || !output) throw new Error('usage: node bench/trace-waterfall.ts <spans.json> <out.png>');
const spans = JSON.parse(fs.readFileSync(input, 'utf8')) as Span[];

const recovered = spans.find((s) => s.name === 'sarsen.attempt' && s.attributes['sarsen.recoveries'] === 1);
if (!recovered) throw new Error('no recovered attempt among the spans');
const requestId = String(recovered.attributes['sarsen.request.id']);
const original = recovered.links[0]!.traceId;
// The request's own trace, the recovered attempt's, and the replays that read it.
const traces = [original, recovered.traceId];
for (const s of spans) {
  if (s.name === 'sarsen.replay' && s.attributes['sarsen.request.id'] === requestId && !traces.includes(s.traceId)) traces.push(s.traceId);
}
const shown = spans.filter((s) => traces.includes(s.traceId));
const t0 = shown.reduce((m, s) => (BigInt(s.startNs) < m ? BigInt(s.startNs) : m), BigInt(shown[0]!.startNs));
const t1 = shown.reduce((m, s) => (BigInt(s.endNs) > m ? BigInt(s.endNs) : m), 0n);
const total = Number(t1 - t0) / 1e6;
const ms = (ns: string) => Number(BigInt(ns) - t0) / 1e6;
const esc = (v: unknown) => String(v).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]!);

// Attributes worth a glance in a row; the rest are in the exported data.
const SHOWN = ['http.response.status_code', 'sarsen.attempt', 'sarsen.recoveries', 'sarsen.group_commit.batch_size', 'gen_ai.response.model', 'gen_ai.usage.input_tokens', 'gen_ai.usage.output_tokens', 'sarsen.stream.frames', 'sarsen.stream.commits', 'sarsen.outcome'];
const KINDS = ['internal', 'internal', 'server', 'client', 'producer', 'consumer'];

function rows(traceId: string): string {
  const inTrace = shown.filter((s) => s.traceId === traceId).sort((a, b) => (BigInt(a.startNs) < BigInt(b.startNs) ? -1 : 1));
  const ids = new Set(inTrace.map((s) => s.spanId));
  const out: string[] = [];
  const walk = (s: Span, depth: number) => {
    const left = (ms(s.startNs) / total) * 100;
    const width = Math.max(((ms(s.endNs) - ms(s.startNs)) / total) * 100, 0.15);
    const service = String(s.resource['service.name']);
    const attrs = SHOWN.filter((k) => s.attributes[k] !== undefined).map((k) => `${k.replace(/^(sarsen|gen_ai)\./, '')}=${esc(s.attributes[k])}`).join(' · ');
    const events = s.events.map((e) => esc(e.name.replace(/^sarsen\./, ''))).join(', ');
    const links = s.links.map((l) => `↪ ${esc(l.attributes['sarsen.link'])} trace ${l.traceId.slice(0, 8)}…`).join(' ');
    out.push(`<div class="row"><div class="name" style="padding-left:${depth * 16 + 6}px"><span class="svc ${service.includes('api') ? 'api' : 'exec'}">${esc(service)}</span>
      <b>${esc(s.name)}</b> <i>${KINDS[s.kind] ?? ''}</i><div class="attrs">${attrs}${events ? ` · events: ${events}` : ''}${links ? ` <span class="link">${links}</span>` : ''}</div></div>
      <div class="lane"><div class="bar ${service.includes('api') ? 'api' : 'exec'}" style="left:${left}%;width:${width}%"></div>
      <span class="dur" style="left:calc(${left + width}% + 4px)">${(ms(s.endNs) - ms(s.startNs)).toFixed(1)} ms</span></div></div>`);
    for (const c of inTrace.filter((x) => x.parentSpanId === s.spanId)) walk(c, depth + 1);
  };
  for (const root of inTrace.filter((s) => !ids.has(s.parentSpanId))) walk(root, 0);
  return out.join('\n');
}

const titles = (traceId: string, i: number) =>
  i === 0 ? `Trace ${traceId} — POST /requests (stream) for ${requestId}: acceptance; attempt 1 died with its executor (SIGKILL), so its span was never exported`
    : traceId === recovered.traceId ? `Trace ${traceId} — the recovered attempt, in another executor process, linked to the request's trace`
      : `Trace ${traceId} — a replay by id, linked to the request's trace`;
const ticks = Array.from({ length: 6 }, (_, i) => `<span style="left:${i * 20}%">${((total * i) / 5).toFixed(0)} ms</span>`).join('');

const html = `<!doctype html><meta charset="utf-8"><style>
body{font:12px system-ui,sans-serif;margin:16px;color:#1d2330;background:#fff}
h1{font-size:15px;margin:0 0 4px} p.note{margin:0 0 12px;color:#5a6170}
h2{font-size:12px;margin:14px 80px 4px 0;padding:4px 6px;background:#eef1f6;border-left:3px solid #5b7bd5}
.row{display:flex;border-bottom:1px solid #eceef2;min-height:30px}
.name{flex:0 0 40%;box-sizing:border-box;padding:3px 0;overflow:hidden} .attrs{color:#5a6170;font-size:11px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.lane{position:relative;flex:1;border-left:1px solid #dde1e8;margin-right:80px}
.bar{position:absolute;top:8px;height:12px;border-radius:2px} .bar.api{background:#5b7bd5} .bar.exec{background:#3fa37c}
.dur{position:absolute;top:7px;font-size:11px;color:#5a6170;white-space:nowrap}
.svc{font-size:10px;padding:0 4px;border-radius:3px;color:#fff;margin-right:4px} .svc.api{background:#5b7bd5} .svc.exec{background:#3fa37c}
i{color:#8a90a0;font-style:normal;font-size:11px} .link{color:#b0542b}
.axis{display:flex} .axis .pad{flex:0 0 40%} .axis .ticks{position:relative;flex:1;height:16px;border-bottom:1px solid #c8cdd6;margin-right:80px}
.ticks span{position:absolute;font-size:10px;color:#5a6170;transform:translateX(-50%)}
</style>
<h1>One request's traces, as Sarsen exported them (OTLP/HTTP), drawn on one time axis</h1>
<p class="note">Drawn by bench/trace-waterfall.ts (our own page, laid out as a trace viewer lays a trace out) from the spans the tracing test's receiver decoded.</p>
<div class="axis"><div class="pad"></div><div class="ticks">${ticks}</div></div>
${traces.map((id, i) => `<h2>${esc(titles(id, i))}</h2>${rows(id)}`).join('\n')}`;

const browser = await launchBrowser();
try {
  await browser.page.setViewportSize({ width: 1400, height: 400 });
  await browser.page.setContent(html);
  await browser.page.screenshot({ path: output, fullPage: true });
  process.stderr.write(`[trace-waterfall] ${shown.length} spans of ${traces.length} traces drawn into ${output}\n`);
} finally {
  await browser.close();
}
