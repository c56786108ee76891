import { expect } from 'chai';
import { prettyLine, logger, addLogSink } from '../../src/log.ts';
import { readEnvironment, ConfigError } from '../../src/config/config.ts';

describe('logging', () => {
  it('a terminal gets one compact line: time, level, message, then the fields', () => {
    const line = prettyLine({ level: 'info', message: 'sarsen listening', time: '2026-01-02T03:04:05.678Z', role: 'both', url: 'http://127.0.0.1:8080', n: 3, note: 'two words' }, false);
    expect(line).to.equal('03:04:05.678 info  sarsen listening url=http://127.0.0.1:8080 n=3 note="two words"');
  });

  it('a stack, when an error carries one, goes below its line, indented', () => {
    const line = prettyLine({ level: 'error', message: 'unexpected fault', time: '2026-01-02T03:04:05.678Z', stack: 'Error: x\n    at f' }, false);
    expect(line.split('\n')).to.deep.equal(['03:04:05.678 error unexpected fault', '    Error: x', '        at f']);
  });

  it('sinks get JSON lines', () => {
    const lines: string[] = [];
    const remove = addLogSink((l) => lines.push(l));
    try {
      logger.warn('written', { figure: 1 });
    } finally {
      remove();
    }
    expect(lines).to.have.length(1);
    expect(JSON.parse(lines[0]!)).to.include({ level: 'warn', message: 'written', figure: 1 });
  });

  it('CTX_LOG_LEVEL sets the level; anything but error, warn, info or debug is refused', () => {
    expect(readEnvironment({}).logLevel).to.equal('info');
    expect(readEnvironment({ CTX_LOG_LEVEL: 'debug' }).logLevel).to.equal('debug');
    expect(() => readEnvironment({ CTX_LOG_LEVEL: 'verbose' })).to.throw(ConfigError, /CTX_LOG_LEVEL/);
  });
});
