// Which OTEL_* variables switch tracing on, and how the rest are read (docs/operations.md "Tracing").
import { expect } from 'chai';
import { readTracing, readEnvironment, ConfigError } from '../../src/config/config.ts';

describe('tracing configuration (OTEL_*)', () => {
  it('is off by default, and with the exporter `none` or the SDK disabled whatever else is set', () => {
    expect(readTracing({})).to.equal(null);
    expect(readEnvironment({}).tracing).to.equal(null);
    expect(readTracing({ OTEL_SERVICE_NAME: 'x', OTEL_TRACES_SAMPLER: 'always_on' })).to.equal(null);
    expect(readTracing({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318', OTEL_TRACES_EXPORTER: 'none' })).to.equal(null);
    expect(readTracing({ OTEL_TRACES_EXPORTER: 'otlp', OTEL_SDK_DISABLED: 'true' })).to.equal(null);
  });

  it('is on with OTEL_TRACES_EXPORTER=otlp, or with an OTLP endpoint named; protobuf over HTTP unless JSON is asked for', () => {
    expect(readTracing({ OTEL_TRACES_EXPORTER: 'otlp' })).to.deep.include({ protocol: 'http/protobuf', serviceName: 'sarsen', sampler: 'parentbased_always_on', ratio: 1, scheduleDelayMs: 5000 });
    expect(readTracing({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' })).to.not.equal(null);
    const t = readTracing({
      OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://collector:4318/v1/traces', OTEL_EXPORTER_OTLP_PROTOCOL: 'http/protobuf', OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: 'http/json',
      OTEL_SERVICE_NAME: 'gateway', OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: '0.25', OTEL_BSP_SCHEDULE_DELAY: '50',
    });
    expect(t).to.deep.include({ protocol: 'http/json', serviceName: 'gateway', sampler: 'parentbased_traceidratio', ratio: 0.25, scheduleDelayMs: 50 });
  });

  it('refuses what it cannot do (gRPC, another exporter, a ratio outside 0..1) by the variable\'s name', () => {
    expect(() => readTracing({ OTEL_TRACES_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' })).to.throw(ConfigError, /OTEL_EXPORTER_OTLP_PROTOCOL/);
    expect(() => readTracing({ OTEL_TRACES_EXPORTER: 'zipkin' })).to.throw(ConfigError, /OTEL_TRACES_EXPORTER/);
    expect(() => readTracing({ OTEL_TRACES_EXPORTER: 'otlp', OTEL_TRACES_SAMPLER_ARG: '2' })).to.throw(ConfigError, /OTEL_TRACES_SAMPLER_ARG/);
  });
});
