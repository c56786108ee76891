// The dialects Sarsen speaks and which backends serve each (docs/api.md "Dialects",
// docs/decisions.md "Responses: a dialect of the chat backends"). A request's dialect is its
// route's; a backend's is fixed by its kind and names a family: a chat backend (the reference
// vendor and the servers that copy it) serves Chat Completions and Responses at one base
// address, so one backend and one rule reach both.

export const DIALECTS = ['chat', 'messages', 'responses'] as const;
/** A request's dialect: the route (or `POST /requests?dialect=`) it came in on. */
export type Dialect = (typeof DIALECTS)[number];
/** A backend's dialect, fixed by its kind. */
export type BackendDialect = 'chat' | 'messages';

export function isDialect(v: unknown): v is Dialect {
  return typeof v === 'string' && (DIALECTS as readonly string[]).includes(v);
}

/** Whether a backend of this dialect serves requests of that one: chat backends serve chat and responses. */
export function servesDialect(backend: BackendDialect, request: Dialect): boolean {
  return backend === 'chat' ? request !== 'messages' : request === backend;
}

/** The provider path a request of this dialect is sent to, after the backend's address. */
export function upstreamPath(dialect: Dialect): string {
  return dialect === 'chat' ? '/chat/completions' : dialect === 'responses' ? '/responses' : '/v1/messages';
}
