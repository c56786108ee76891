// Accepting a submission (docs/api.md "What happens to a submission"): authenticate (done by the
// route), refuse loops, read and canonicalise the body, resolve the routing rule and build the
// request (control/routed-request.ts, the batch dispatcher's path too), then hand it to
// the process's submitter (one group commit checks the key's rate limits, records and enqueues
// it, looks up the response cache when it applies, and claims it when this process runs it: then
// its provider call has started by the time this returns). Shared by every submission route.
import type { Request } from 'express';
import type { Deps } from '../../deps.ts';
import type { ServiceAuth } from '../service-auth.ts';
import { ServiceError } from '../../core/errors.ts';
import { readBody, decodeUtf8, MAX_SUBMISSION_BYTES } from '../body.ts';
import { parseCanonical, CanonicalJsonError, topLevelBoolean, type JsonValue } from '../../core/canonical-json.ts';
import { bodyModel } from '../../core/submission-body.ts';
import { forwardableHeaders, parseHops, HOPS_HEADER } from '../../core/header-policy.ts';
import { routedRequest } from '../../control/routed-request.ts';
import type { Dialect } from '../../core/dialects.ts';
import { MeteringRefusal, type Submitted } from '../../db/submissions.ts';
import { RateLimitRefusal } from '../../db/rate-limits.ts';
import { CACHE_HEADER, parseCacheHeader, cachePolicy, cacheKey } from '../../core/response-cache.ts';
import { countRateLimited } from '../../metrics/metrics.ts';
import { callerCredential } from './caller-credential.ts';
import { tracer, activeSpan } from '../../telemetry/tracing.ts';
import { traceAcceptance, currentTraceParent, linkAttached } from '../../telemetry/spans.ts';
import { requestTraceParent } from '../../db/requests.ts';
import type { NewSubmission } from '../../deps.ts';
import { liveClaim } from '../../db/attach.ts';

// A re-sent body that may only land on a live execution, never start one (docs/api.md "Attach only").
const ATTACH_HEADER = 'x-sarsen-attach';

/** What a submission route answers from: the request the submission landed on, and whether it streams. */
/** `background`: a Responses body that asked for the vendor's background mode (docs/api.md "Background responses"). */
export type AcceptedSubmission = Submitted & { streaming: boolean; background: boolean };

function parseBody(bytes: Buffer): { value: JsonValue; text: string } {
  try {
    return parseCanonical(decodeUtf8(bytes));
  } catch (err) {
    if (err instanceof CanonicalJsonError) throw new ServiceError('bad_request', `The body is not valid JSON: ${err.message}`);
    throw err;
  }
}

export async function acceptSubmission(
  deps: Deps,
  req: Request,
  auth: ServiceAuth,
  dialect: Dialect,
  opts: { fireAndForget: boolean },
): Promise<AcceptedSubmission> {
  const settings = deps.settings.current();
  const hops = parseHops(req.headers[HOPS_HEADER]);
  if (hops >= settings.reroute_ceiling) {
    throw new ServiceError(
      'loop_detected',
      `The submission arrived at re-route depth ${hops}; the ceiling is ${settings.reroute_ceiling}.`,
    );
  }
  const { value, text } = parseBody(await readBody(req, MAX_SUBMISSION_BYTES));
  const named = bodyModel(value);
  if ('refused' in named) throw new ServiceError('bad_request', named.refused);
  const streaming = topLevelBoolean(value, 'stream') === true;
  const background = dialect === 'responses' && topLevelBoolean(value, 'background') === true;
  const directive = parseCacheHeader(req.headers[CACHE_HEADER]);
  if (typeof directive === 'string') throw new ServiceError('bad_request', directive);

  const routed = await routedRequest(
    deps,
    { tenancyId: auth.tenancyId, namespaceId: auth.namespaceId, apiKeyId: auth.apiKeyId, limits: auth.limits, dialect, model: named.model, text, value, streaming },
    { namespace: `namespace ${auth.namespaceName}`, speaker: 'this route', synchronous: !opts.fireAndForget, credential: callerCredential(req.headers) },
  );
  const { id, identity, backend, upstreamModel } = routed;
  if (!opts.fireAndForget && req.headers[ATTACH_HEADER] !== undefined) {
    if (String(req.headers[ATTACH_HEADER]).trim().toLowerCase() !== 'only') throw new ServiceError('bad_request', `${ATTACH_HEADER} takes the value \`only\`.`);
    const live = await liveClaim(deps.pool, auth.namespaceId, identity);
    if (live === null) {
      throw new ServiceError('not_found', 'No execution of this body is live in the idempotency window of this namespace; nothing was submitted.');
    }
    return { requestId: live.requestId, attached: true, status: live.status, jobId: null, cachedFrom: null, streaming, background };
  }
  const policy = cachePolicy(auth.cacheTtlMinutes, directive);
  const submission: NewSubmission = {
    ...routed,
    forwardedHeaders: forwardableHeaders(dialect, req.rawHeaders),
    hops,
    cache: policy === null ? null : { key: cacheKey(identity, backend.backend_id, upstreamModel), ...policy },
    // Nobody waits on a POST /requests: its work yields to acceptance. A background response's
    // caller polls or resumes it from the moment its create answers: it does not.
    callerWaits: !opts.fireAndForget,
    // The caller's request span: attempts continue its trace (docs/operations.md "Tracing").
    traceParent: tracer === null ? null : currentTraceParent(),
  };
  const submitting = tracer === null ? deps.submitter.submit(submission) : traceAcceptance(tracer, id, dialect, streaming, () => deps.submitter.submit(submission));
  const submitted = await submitting.catch((err: unknown) => {
    if (err instanceof MeteringRefusal) throw new ServiceError(err.reason, err.message);
    if (err instanceof RateLimitRefusal) {
      countRateLimited(err.limit);
      if (tracer !== null) activeSpan()?.setAttribute('sarsen.rate_limit', `refused_${err.limit}`);
      throw new ServiceError('rate_limited', err.message, { retryAfterSeconds: err.retryAfterSeconds });
    }
    throw err;
  });
  if (tracer !== null) await traceAccepted(deps, auth, dialect, submitted);
  return { ...submitted, streaming, background };
}

/** What the caller's request span learns of an accepted submission; one that attached links to the execution's trace. */
async function traceAccepted(deps: Deps, auth: ServiceAuth, dialect: Dialect, submitted: Submitted): Promise<void> {
  const span = activeSpan();
  span?.setAttribute('sarsen.dialect', dialect);
  span?.setAttribute('sarsen.rate_limit', auth.limits === null ? 'none' : 'passed');
  if (submitted.attached) linkAttached([span], await requestTraceParent(deps.pool, submitted.requestId).catch(() => null));
}
