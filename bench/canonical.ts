// Canonical JSON throughput versus JSON.parse + JSON.stringify (docs/performance.md "Targets":
// target ≥ 50%). Run: npm exec -- node bench/canonical.ts
import { parseCanonical, withTopLevelField, jsonString } from '../src/core/canonical-json.ts';
import { prng } from '../test/support/prng.ts';


const WORDS = [
  'the', 'request', 'model', 'stream', 'durable', 'proxy', 'answer', 'provider', 'retry', 'token',
  'function', 'return', 'value', 'error', 'café', 'naïve', 'über', 'Zürich', '東京', '数据库',
  'привет', 'λόγος', '🙂', '🚀', 'données', 'straße', 'x', 'a', 'is', 'of', 'and', 'to', 'in',
];
const PUNCT = ['. ', ', ', '; ', '? ', '! ', ': ', '\n', '\n\n', ' "quoted" ', ' (see C:\\temp\\out.log) ', '\t'];

function prose(rnd: () => number, chars: number): string {
  const parts: string[] = [];
  let n = 0;
  while (n < chars) {
    const w = rnd() < 0.12 ? PUNCT[Math.floor(rnd() * PUNCT.length)] : WORDS[Math.floor(rnd() * WORDS.length)] + ' ';
    parts.push(w);
    n += w.length;
  }
  if (rnd() < 0.3) parts.push('\n```ts\nconst x = { "a": 1 };\nconsole.log(`${x}`);\n```\n');
  return parts.join('');
}

function schema(rnd: () => number, depth: number): Record<string, unknown> {
  const props: Record<string, unknown> = {};
  const n = 2 + Math.floor(rnd() * 4);
  for (let i = 0; i < n; i++) {
    const name = `field_${i}_${Math.floor(rnd() * 1000)}`;
    props[name] = depth > 0 && rnd() < 0.4
      ? schema(rnd, depth - 1)
      : { type: ['string', 'integer', 'number', 'boolean'][i % 4], description: prose(rnd, 60), minimum: 0, maximum: 1.5e3 };
  }
  return { type: 'object', properties: props, required: Object.keys(props).slice(0, 2), additionalProperties: false };
}

const BIG_SEED = '<big-seed>';

function chatBody(targetBytes: number, seed: number): string {
  const rnd = prng(seed);
  const tools = Array.from({ length: 6 }, (_, i) => ({
    type: 'function',
    function: { name: `tool_${i}`, description: prose(rnd, 200), parameters: schema(rnd, 3) },
  }));
  const messages: unknown[] = [{ role: 'system', content: prose(rnd, 2000) }];
  const body = { model: 'gpt-4o-mini', messages, tools, temperature: 0.7, top_p: 1.0, max_tokens: 4096, stream: false, seed: BIG_SEED };
  let size = Buffer.byteLength(JSON.stringify(body));
  const add = (message: unknown) => {
    messages.push(message);
    size += Buffer.byteLength(JSON.stringify(message)) + 1;
  };
  while (size < targetBytes) {
    const turn = messages.length % 2 === 1 ? 'user' : 'assistant';
    if (turn === 'assistant' && rnd() < 0.25) {
      add({ role: 'assistant', content: null, tool_calls: [{ id: `call_${messages.length}`, type: 'function', function: { name: 'tool_1', arguments: JSON.stringify({ q: prose(rnd, 80), n: 3 }) } }] });
      add({ role: 'tool', tool_call_id: `call_${messages.length - 1}`, content: prose(rnd, 600) });
    } else {
      add({ role: turn, content: prose(rnd, 300 + Math.floor(rnd() * 3000)) });
    }
  }
  // A big integer no JS number can hold, spelled as a client would send it.
  return JSON.stringify(body).replace(JSON.stringify(BIG_SEED), '12345678901234567890');
}

// Reading a character flattens V8's concatenation ropes, so the cost of producing
// one contiguous string (as hashing or sending needs) is counted on both sides.
function lastChar(s: string): number {
  return s.charCodeAt(s.length - 1);
}

function measure(fn: () => number, bytes: number, minMs: number): number {
  let sink = 0;
  for (let i = 0; i < 20; i++) sink += fn(); // warm-up
  let iterations = 0;
  const start = process.hrtime.bigint();
  let elapsed = 0;
  while (elapsed < minMs) {
    sink += fn();
    iterations++;
    elapsed = Number(process.hrtime.bigint() - start) / 1e6;
  }
  if (sink === 0) throw new Error('unreachable: keeps the work observable');
  return (bytes * iterations) / (elapsed / 1000) / 1e6;
}

const rows: string[][] = [['body', 'bytes', 'JSON.parse+stringify MB/s', 'parseCanonical MB/s', 'ratio', 'model rewrite MB/s']];
// V8's JSON.stringify is much slower on two-byte (non-Latin-1) strings, so the ratio
// depends on content: the ASCII rows show the less flattering case.
const asciiOnly = (body: string) => body.replace(/[^\x00-\x7f]/g, '?');
const cases = [
  ['~200 KiB', 200 * 1024, (b: string) => b],
  ['~2 MiB', 2 * 1024 * 1024, (b: string) => b],
  ['~200 KiB ASCII', 200 * 1024, asciiOnly],
  ['~2 MiB ASCII', 2 * 1024 * 1024, asciiOnly],
  // Mostly tool schemas: many small objects, where a JS parser is weakest.
  ['schema-heavy', 1024, asciiOnly],
] as const;
for (const [label, target, shape] of cases) {
  const body = shape(chatBody(target, 42));
  const bytes = Buffer.byteLength(body);
  const parsed = parseCanonical(body);
  const base = measure(() => lastChar(JSON.stringify(JSON.parse(body))), bytes, 1500);
  const ours = measure(() => lastChar(parseCanonical(body).text), bytes, 1500);
  const rewrite = measure(() => lastChar(withTopLevelField(parsed.value, 'model', jsonString('other-model'))), bytes, 1000);
  rows.push([label, String(bytes), base.toFixed(0), ours.toFixed(0), `${((ours / base) * 100).toFixed(0)}%`, rewrite.toFixed(0)]);
}
const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
for (const r of rows) console.log(r.map((cell, c) => cell.padStart(widths[c])).join('  '));
console.log('target (docs/performance.md): parseCanonical >= 50% of JSON.parse+stringify');
