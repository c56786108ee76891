// Mocha root hooks: the leak guard and the run-wide database teardown.
import { configureLogging } from '../../src/log.ts';
import { mark, leakedSince, describeLeaks, liveHandles } from './resources.ts';
import { shutdownDatabases } from './db.ts';
import { installLogGuard, assertNoSecretsLogged } from './log-guard.ts';

// Logs go to the capture sinks tests install; stdout stays readable. SARSEN_TEST_LOGS=1 shows them.
configureLogging({ stdout: process.env.SARSEN_TEST_LOGS === '1', level: 'debug' });
// Every line of the run is kept, so the end of the run can prove no registered secret was logged.
installLogGuard();

let testMark = 0;
let runMark = 0;

export const mochaHooks = {
  beforeAll() {
    runMark = mark();
  },
  beforeEach() {
    testMark = mark();
  },
  afterEach() {
    // Root afterEach runs after the suite's own afterEach: whatever a test (or its per-test
    // hooks) opened must be closed by now.
    const leaks = leakedSince(testMark);
    if (leaks.length > 0) throw new Error(`The test left resources open:\n${describeLeaks(leaks)}`);
  },
  async afterAll() {
    const leaks = leakedSince(runMark);
    await shutdownDatabases();
    if (leaks.length > 0) throw new Error(`Suites left resources open:\n${describeLeaks(leaks)}`);
    // Give closed sockets a moment to be reaped before asking Node what is still alive.
    await new Promise((r) => setTimeout(r, 50));
    const handles = liveHandles();
    if (handles.length > 0) throw new Error(`Handles still open after the run: ${handles.join(', ')}`);
    assertNoSecretsLogged();
  },
};
