import { expect } from 'chai';
import { memoryLimit, oldSpaceMb, runtimeSettings, workerExecArgv, HEAP_CAP_MB } from '../../src/core/runtime-flags.ts';

const MB = 1024 * 1024;
const GB = 1024 * MB;

describe('runtime flags', () => {
  it('takes a limit below the machine\'s memory as the limit, and none otherwise', () => {
    expect(memoryLimit(512 * MB, 24 * GB)).to.equal(512 * MB);
    expect(memoryLimit(undefined, 24 * GB)).to.equal(null);
    expect(memoryLimit(0, 24 * GB)).to.equal(null);
    // cgroup v1 without a limit, as Node reports it
    expect(memoryLimit(2 ** 64, 24 * GB)).to.equal(null);
    expect(memoryLimit(32 * GB, 24 * GB)).to.equal(null);
  });

  it('sizes the heap at half of a limit, at most 1024 MB, 1024 MB without one', () => {
    expect(oldSpaceMb(null)).to.equal(HEAP_CAP_MB);
    expect(oldSpaceMb(256 * MB)).to.equal(128);
    expect(oldSpaceMb(512 * MB)).to.equal(256);
    expect(oldSpaceMb(1 * GB)).to.equal(512);
    expect(oldSpaceMb(2 * GB)).to.equal(1024);
    expect(oldSpaceMb(16 * GB)).to.equal(1024);
    expect(oldSpaceMb(64 * MB)).to.equal(64); // a floor V8 can work in
  });

  it('adds the flags and MALLOC_ARENA_MAX, leaving what the operator set alone', () => {
    const under = (given: string[], env: Record<string, string> = {}) => runtimeSettings({ constrained: 512 * MB, total: 24 * GB, given, env });
    expect(under([])).to.deep.equal({ flags: ['--max-semi-space-size=16', '--max-old-space-size=256'], env: { MALLOC_ARENA_MAX: '2' } });
    expect(under(['--max-old-space-size=700']).flags).to.deep.equal(['--max-semi-space-size=16']);
    expect(under(['--max_old_space_size=700', '--max-semi-space-size', '8']).flags).to.deep.equal([]);
    expect(under([], { MALLOC_ARENA_MAX: '4' }).env).to.deep.equal({});
    expect(runtimeSettings({ constrained: undefined, total: 24 * GB, given: [], env: {} }).flags).to.include('--max-old-space-size=1024');
  });

  it('splits the heap the launcher chose among the workers of --processes, and leaves an operator\'s own flag alone', () => {
    const chosen = ['--max-semi-space-size=16', '--max-old-space-size=256'];
    expect(workerExecArgv(chosen, chosen.join(' '), 512 * MB, 2)).to.deep.equal(['--max-semi-space-size=16', '--max-old-space-size=128']);
    expect(workerExecArgv(chosen, chosen.join(' '), 2 * GB, 4)).to.deep.equal(['--max-semi-space-size=16', '--max-old-space-size=256']);
    // Without a limit each worker keeps the cap, as a single process does.
    expect(workerExecArgv(['--max-old-space-size=1024'], '--max-old-space-size=1024', null, 8)).to.deep.equal(['--max-old-space-size=1024']);
    // The operator's flag: the launcher chose none, so nothing changes.
    expect(workerExecArgv(['--max-old-space-size=700'], '--max-semi-space-size=16', 512 * MB, 2)).to.deep.equal(['--max-old-space-size=700']);
  });
});
