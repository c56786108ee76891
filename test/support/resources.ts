// The leak guard. Every pool, server, database and child process the harness hands out is
// registered here with where it was made; a test that leaves one open fails (root hooks in
// hooks.ts), and so does a run that ends with sockets or child processes still alive.

type Entry = { id: number; kind: string; label: string; stack: string };

const open = new Map<number, Entry>();
let nextId = 1;

/** Registers a resource; call the returned function when it is closed. */
export function track(kind: string, label: string): () => void {
  const id = nextId++;
  const stack = (new Error().stack ?? '').split('\n').slice(2, 6).join('\n');
  open.set(id, { id, kind, label, stack });
  return () => {
    open.delete(id);
  };
}

export function mark(): number {
  return nextId;
}

/** Resources made at or after `since` that are still open. */
export function leakedSince(since: number): Entry[] {
  return [...open.values()].filter((e) => e.id >= since);
}

export function describeLeaks(entries: Entry[]): string {
  return entries.map((e) => `- ${e.kind} ${e.label}, opened at\n${e.stack}`).join('\n');
}

/** Handles Node itself still holds that a finished run must not: sockets, servers, child processes. */
export function liveHandles(): string[] {
  return process
    .getActiveResourcesInfo()
    .filter((r) => /^(TCPSocketWrap|TCPServerWrap|ProcessWrap|TCPWRAP|PROCESSWRAP)$/i.test(r));
}
