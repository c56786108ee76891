// The log guard: every log line of the whole run is captured (a process-wide sink on the
// winston logger, plus every line a child process prints, JSON or not, which
// test/support/child.ts hands over), and every secret a test makes (passwords, session tokens,
// API keys, provider credentials) is registered. At the end of the run, the root hook fails if
// any registered secret appears in any line a test has not allowed as a deliberate print.
import { addLogSink } from '../../src/log.ts';

const lines: string[] = [];
const secrets = new Set<string>();
const allowed = new Set<string>();
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

/**
 * Whole lines a child process printed (log lines, plain prints such as `sarsen: <message>`,
 * crash traces), checked like this process's own lines.
 */
export function registerOutput(text: string): void {
  for (const line of text.split('\n')) if (line) lines.push(line);
}

/**
 * A line a child printed on purpose with a secret in it (a command showing its user a generated
 * password once): exempt from the check as this exact line, so the same secret anywhere else
 * still fails the run.
 */
export function allowPrintedLine(line: string): void {
  allowed.add(line);
}

export type Leak = { secret: string; line: string };

/** Pure check: every (secret, line) pair where the line contains the secret, allowed lines aside. */
export function findLeaks(captured: readonly string[], registered: Iterable<string>, allowedLines: ReadonlySet<string> = new Set()): Leak[] {
  const leaks: Leak[] = [];
  for (const secret of registered) {
    for (const line of captured) if (line.includes(secret) && !allowedLines.has(line)) leaks.push({ secret, line });
  }
  return leaks;
}

/** The lines captured so far (for the guard's own tests). */
export function capturedLines(): readonly string[] {
  return lines;
}

export function logGuardStats(): { lines: number; secrets: number } {
  return { lines: lines.length, secrets: secrets.size };
}

/** Throws when a registered secret was logged; the message masks the secret itself. */
export function assertNoSecretsLogged(): void {
  const leaks = findLeaks(lines, secrets, allowed);
  if (leaks.length === 0) return;
  const shown = leaks.slice(0, 5).map(({ secret, line }) => {
    const masked = `${secret.slice(0, 4)}…(${secret.length} chars)`;
    return `- ${masked} in: ${line.split(secret).join('<SECRET>').slice(0, 300)}`;
  });
  throw new Error(`${leaks.length} registered secret(s) appeared in the log:\n${shown.join('\n')}`);
}
