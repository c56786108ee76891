// Tenancy and namespace names are URL path segments (docs/api.md "Identifiers and formats").

const SLUG_RE = /^[a-z0-9][a-z0-9-]{0,62}$/;

// `v1` would collide with the control plane under `/{tenancy}/v1/...`.
const RESERVED_NAMESPACE_NAMES: ReadonlySet<string> = new Set(['v1']);
// Root-level routes that sit outside any tenancy, plus `v1` so a client that appends
// `/v1/...` to a bare host never lands in a tenancy by accident.
const RESERVED_TENANCY_NAMES: ReadonlySet<string> = new Set(['v1', 'healthz', 'readyz']);

/** `[a-z0-9][a-z0-9-]{0,62}`: lowercase, starts with a letter or digit, at most 63 long. */
export function isSlug(s: unknown): s is string {
  return typeof s === 'string' && SLUG_RE.test(s);
}

/** A slug that is not reserved for a namespace path segment. */
export function isNamespaceName(s: unknown): s is string {
  return isSlug(s) && !RESERVED_NAMESPACE_NAMES.has(s);
}

/** A slug that is not reserved for a tenancy path segment. */
export function isTenancyName(s: unknown): s is string {
  return isSlug(s) && !RESERVED_TENANCY_NAMES.has(s);
}
