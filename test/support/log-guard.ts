// The log guard: every log line of the whole run is captured (a process-wide sink on the
// winston logger, plus whatever tests hand over from child processes), and every secret a
// test makes (passwords, session tokens, API keys, provider credentials) is registered. At
// the end of the run, the root hook fails if any registered secret appears in any line.
import { addLogSink } from '../../src/log.ts';

const lines: string[] = [];
const secrets = new Set<string>();
let removeSink: (() => void) | null = null;

// Shorter strings could occur in a line by chance; no real secret is this short.
const MIN_SECRET_LENGTH = 8;

/** Starts capturing (idempotent); hooks.ts calls it when the run starts. */
export function installLogGuard(): void {
  removeSink ??= addLogSink((line) => lines.push(line));
}

export function uninstallLogGuard(): void {
  removeSink?.();
  removeSink = null;
}

/** A value that must never appear in a log line. */
export function registerSecret(value: string | null | undefined): void {
  if (typeof value !== 'string' || value.length < MIN_SECRET_LENGTH) {
    throw new Error('registerSecret needs the secret itself (a string of at least 8 characters)');
  }
  secrets.add(value);
}

/** Log output a child process produced, checked like this process's own lines. */
export function registerOutput(text: string): void {
  if (text) lines.push(text);
}

/** The JSON log lines of a child's mixed output (its deliberate plain prints excluded). */
export function logLinesOf(output: string): string {
  return output
    .split('\n')
    .filter((l) => l.trimStart().startsWith('{'))
    .join('\n');
}

export type Leak = { secret: string; line: string };

/** Pure check: every (secret, line) pair where the line contains the secret. */
export function findLeaks(captured: readonly string[], registered: Iterable<string>): Leak[] {
  const leaks: Leak[] = [];
  for (const secret of registered) {
    for (const line of captured) if (line.includes(secret)) leaks.push({ secret, line });
  }
  return leaks;
}

export function logGuardStats(): { lines: number; secrets: number } {
  return { lines: lines.length, secrets: secrets.size };
}

/** Throws when a registered secret was logged; the message masks the secret itself. */
export function assertNoSecretsLogged(): void {
  const leaks = findLeaks(lines, secrets);
  if (leaks.length === 0) return;
  const shown = leaks.slice(0, 5).map(({ secret, line }) => {
    const masked = `${secret.slice(0, 4)}…(${secret.length} chars)`;
    return `- ${masked} in: ${line.split(secret).join('<SECRET>').slice(0, 300)}`;
  });
  throw new Error(`${leaks.length} registered secret(s) appeared in the log:\n${shown.join('\n')}`);
}
