// The one error type Sarsen raises itself, and the one table of codes (docs/api.md
// "Errors"). Provider refusals never pass through here.

export const ERROR_CODES = {
  bad_request: { status: 400, message: 'The request is malformed.' },
  sarsen_key_forwarded: {
    status: 400,
    message: 'A header the provider would read carries a Sarsen key; send the key in X-Sarsen-Key alone.',
  },
  unauthorised: { status: 401, message: 'Missing or invalid API key.' },
  provider_credential: {
    status: 401,
    message:
      'The bearer token is a provider credential, not a Sarsen key. Send the Sarsen key in X-Sarsen-Key or in Authorization: Bearer.',
  },
  caller_credential_missing: {
    status: 401,
    message: 'This backend forwards the caller\'s own provider credential; send it in Authorization or x-api-key.',
  },
  insufficient_credits: { status: 402, message: 'The tenancy has no credit left.' },
  spend_limit_reached: { status: 402, message: 'A spend limit was reached.' },
  forbidden: { status: 403, message: 'The key has no grant for this scope.' },
  password_change_required: {
    status: 403,
    message: 'Choose a new password first: POST /{tenancy}/v1/account/password.',
  },
  password_rejected: { status: 403, message: 'The current password offered does not match.' },
  not_found: { status: 404, message: 'No such resource.' },
  conflict: { status: 409, message: 'The resource already exists or changed underneath.' },
  record_expired: { status: 410, message: 'The request ran, but its record has been swept by retention.' },
  body_too_large: { status: 413, message: 'The submission body is larger than 2 MiB.' },
  unsupported_media_type: { status: 415, message: 'Send the body as application/json.' },
  unprocessable_entity: { status: 422, message: 'The request is well-formed but cannot be acted on.' },
  backend_host_refused: {
    status: 422,
    message: 'The backend address points inside the deployment\'s own network.',
  },
  passthrough_disabled: { status: 422, message: 'Caller-credential backends are not available here.' },
  // A key over its rate limit (docs/api.md "Rate limits"); nothing was accepted.
  // Distinct from a provider's own 429, which passes through unchanged.
  rate_limited: { status: 429, message: 'The API key is over its rate limit; try again after the time in Retry-After.' },
  // The sign-in throttle (docs/administration.md "Sign-in throttling").
  too_many_attempts: { status: 429, message: 'Too many sign-in attempts; try again after the time in Retry-After.' },
  // The stored error of a request cancelled by POST /requests/{id}/cancel. 499, not a 409
  // or 5xx, so the official SDKs do not resubmit it.
  cancelled: { status: 499, message: 'The request was cancelled.' },
  internal: { status: 500, message: 'Internal error.' },
  upstream_failed: { status: 502, message: 'The provider could not be reached.' },
  // The database is unreachable for a moment (an outage or restart). Nothing was accepted;
  // the official SDKs retry a 503 on their own, after Retry-After.
  unavailable: { status: 503, message: 'The service cannot reach its database for a moment; retry shortly.' },
  held_too_long: { status: 504, message: 'Gave up waiting; the execution continues.' },
  loop_detected: { status: 508, message: 'The submission arrived at the re-route ceiling.' },
} as const satisfies Record<string, { status: number; message: string }>;

export type ErrorCode = keyof typeof ERROR_CODES;

export class ServiceError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  /** Seconds to send in Retry-After, when the answer says when to try again. */
  readonly retryAfterSeconds: number | undefined;

  constructor(code: ErrorCode, message?: string, opts: { retryAfterSeconds?: number } = {}) {
    super(message ?? ERROR_CODES[code].message);
    this.name = 'ServiceError';
    this.code = code;
    this.status = ERROR_CODES[code].status;
    this.retryAfterSeconds = opts.retryAfterSeconds;
  }
}

export function errorBody(code: ErrorCode, message: string): string {
  return JSON.stringify({ error: { code, message } });
}
