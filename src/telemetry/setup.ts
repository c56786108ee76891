// Starting and stopping the OpenTelemetry SDK (docs/operations.md "Tracing"). Loaded only when
// tracing is on, so a process without it never loads the SDK or the exporter. Spans leave in
// batches (OTEL_BSP_*) over OTLP/HTTP, JSON or protobuf; the exporter reads its endpoint,
// headers, timeout and compression from OTEL_EXPORTER_OTLP_* itself, once, here.
import { context, propagation, trace, type HrTime } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator, millisToHrTime } from '@opentelemetry/core';
import { detectResources, envDetector, resourceFromAttributes } from '@opentelemetry/resources';
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BatchSpanProcessor,
  ParentBasedSampler,
  TraceIdRatioBasedSampler,
  TracerProvider,
  type Sampler,
  type SpanExporter,
  type SpanProcessor,
} from '@opentelemetry/sdk-trace';
import { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION } from '@opentelemetry/semantic-conventions';
import type { TracingConfig } from '../config/config.ts';
import { correlateLogLines } from '../log.ts';
import { useTracer, logFields } from './tracing.ts';
import { watchPauses } from './pauses.ts';

let provider: TracerProvider | null = null;
let unwatch: (() => void) | null = null;

function samplerOf(cfg: TracingConfig): Sampler {
  const root = cfg.sampler.endsWith('always_off') ? new AlwaysOffSampler() : cfg.sampler.endsWith('traceidratio') ? new TraceIdRatioBasedSampler(cfg.ratio) : new AlwaysOnSampler();
  return cfg.sampler.startsWith('parentbased_') ? new ParentBasedSampler({ root }) : root;
}

// The SDK starts a span at Date.now(), a whole millisecond, and measures its events and end from
// there on the performance clock: two spans of one request could stand up to a millisecond apart
// in either order. A span started without a time of its own (the pauses come with theirs, never a
// whole millisecond) starts at the performance clock's now instead, so a request's milestones
// compare to the microsecond across its spans (bench:compare --trace).
const preciseStarts: SpanProcessor = {
  onStart(span) {
    if (span.startTime[1] % 1_000_000 === 0) (span as unknown as { startTime: HrTime }).startTime = millisToHrTime(performance.timeOrigin + performance.now());
  },
  onEnd() {},
  forceFlush: () => Promise.resolve(),
  shutdown: () => Promise.resolve(),
};

async function exporterOf(cfg: TracingConfig): Promise<SpanExporter> {
  if (cfg.protocol === 'http/json') return new (await import('@opentelemetry/exporter-trace-otlp-http')).OTLPTraceExporter();
  return new (await import('@opentelemetry/exporter-trace-otlp-proto')).OTLPTraceExporter();
}

/** Starts tracing for this process (null: it stays off). `role`: what the process serves. */
export async function startTracing(cfg: TracingConfig | null, role: string): Promise<void> {
  if (cfg === null || provider !== null) return;
  // OTEL_RESOURCE_ATTRIBUTES add to (and OTEL_SERVICE_NAME names) the resource.
  const resource = resourceFromAttributes({ [ATTR_SERVICE_NAME]: cfg.serviceName, [ATTR_SERVICE_VERSION]: '0.1.0', 'sarsen.role': role, 'process.pid': process.pid })
    .merge(detectResources({ detectors: [envDetector] }));
  provider = new TracerProvider({
    resource,
    sampler: samplerOf(cfg),
    spanProcessors: [
      preciseStarts,
      new BatchSpanProcessor({
        exporter: await exporterOf(cfg),
        scheduledDelayMillis: cfg.scheduleDelayMs,
        exportTimeoutMillis: cfg.exportTimeoutMs,
        maxQueueSize: cfg.maxQueueSize,
        maxExportBatchSize: cfg.maxExportBatchSize,
      }),
    ],
  });
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  trace.setGlobalTracerProvider(provider);
  const tracer = provider.getTracer('sarsen', '0.1.0');
  useTracer(tracer, stopTracing);
  unwatch = watchPauses(tracer);
  correlateLogLines(logFields);
}

/** Exports what is left and stops. */
async function stopTracing(): Promise<void> {
  const p = provider;
  if (p === null) return;
  provider = null;
  unwatch?.();
  unwatch = null;
  await p.forceFlush().catch(() => {});
  await p.shutdown().catch(() => {});
}
