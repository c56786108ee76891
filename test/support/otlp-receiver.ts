// An OTLP/HTTP receiver on 127.0.0.1 for the tracing tests: it takes what Sarsen processes
// export with OTEL_EXPORTER_OTLP_PROTOCOL=http/json (POST /v1/traces) and decodes the spans,
// keeping every body as it arrived so a test can search all of it (for secrets, for prompts).
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { track } from './resources.ts';

export type Attrs = Record<string, unknown>;
export type ExportedSpan = {
  traceId: string;
  spanId: string;
  parentSpanId: string;
  name: string;
  kind: number;
  attributes: Attrs;
  events: { name: string; attributes: Attrs; timeNs: bigint }[];
  links: { traceId: string; spanId: string; attributes: Attrs }[];
  status: number;
  resource: Attrs;
  startNs: bigint;
  endNs: bigint;
};

export type OtlpReceiver = {
  /** The base address to give as OTEL_EXPORTER_OTLP_ENDPOINT. */
  url: string;
  spans: ExportedSpan[];
  /** Every body received, as text. */
  bodies: string[];
  /** Resolves with the spans once `pred` finds what it needs among them (re-checked on every export). */
  until<T>(pred: (spans: ExportedSpan[]) => T | undefined, timeoutMs?: number): Promise<T>;
  close(): Promise<void>;
};

type AnyValue = { stringValue?: string; intValue?: string | number; doubleValue?: number; boolValue?: boolean; arrayValue?: { values?: AnyValue[] } };

function valueOf(v: AnyValue): unknown {
  if (v.stringValue !== undefined) return v.stringValue;
  if (v.intValue !== undefined) return Number(v.intValue);
  if (v.doubleValue !== undefined) return v.doubleValue;
  if (v.boolValue !== undefined) return v.boolValue;
  if (v.arrayValue !== undefined) return (v.arrayValue.values ?? []).map(valueOf);
  return undefined;
}

const attrs = (list: { key: string; value: AnyValue }[] | undefined): Attrs => Object.fromEntries((list ?? []).map((a) => [a.key, valueOf(a.value)]));

/** The spans of one OTLP/HTTP JSON export body. */
export function decodeSpans(text: string): ExportedSpan[] {
  const spans: ExportedSpan[] = [];
  const doc = JSON.parse(text) as { resourceSpans?: any[] };
  for (const rs of doc.resourceSpans ?? []) {
    const resource = attrs(rs.resource?.attributes);
    for (const ss of rs.scopeSpans ?? []) {
      for (const s of ss.spans ?? []) {
        spans.push({
          traceId: s.traceId,
          spanId: s.spanId,
          parentSpanId: s.parentSpanId ?? '',
          name: s.name,
          kind: s.kind,
          attributes: attrs(s.attributes),
          events: (s.events ?? []).map((e: any) => ({ name: e.name, attributes: attrs(e.attributes), timeNs: BigInt(e.timeUnixNano) })),
          links: (s.links ?? []).map((l: any) => ({ traceId: l.traceId, spanId: l.spanId, attributes: attrs(l.attributes) })),
          status: s.status?.code ?? 0,
          resource,
          startNs: BigInt(s.startTimeUnixNano),
          endNs: BigInt(s.endTimeUnixNano),
        });
      }
    }
  }
  return spans;
}

export async function startOtlpReceiver(): Promise<OtlpReceiver> {
  const spans: ExportedSpan[] = [];
  const bodies: string[] = [];
  const waiters = new Set<() => void>();
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const text = Buffer.concat(chunks).toString('utf8');
      bodies.push(text);
      if (req.url === '/v1/traces' && /json/.test(req.headers['content-type'] ?? '')) {
        spans.push(...decodeSpans(text));
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      for (const w of waiters) w();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  const untrack = track('server', `otlp receiver :${port}`);
  return {
    url: `http://127.0.0.1:${port}`,
    spans,
    bodies,
    until(pred, timeoutMs = 30_000) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const found = pred(spans);
          if (found === undefined) return;
          waiters.delete(check);
          clearTimeout(timer);
          resolve(found);
        };
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`the spans awaited did not arrive within ${timeoutMs} ms (${spans.length} arrived: ${[...new Set(spans.map((s) => s.name))].join(', ')})`));
        }, timeoutMs);
        waiters.add(check);
        check();
      });
    },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      untrack();
    },
  };
}
