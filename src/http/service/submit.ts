// Accepting a submission (SPEC.md "Endpoints: Submission"): authenticate (done by the route),
// refuse loops, read and canonicalise the body, resolve the routing rule, then hand it to the
// process's submitter (one group commit claims, records and enqueues). Shared by all three
// submission routes.
import type { Request } from 'express';
import type { Deps } from '../../deps.ts';
import type { ServiceAuth } from '../service-auth.ts';
import { ServiceError } from '../../core/errors.ts';
import { readBody, decodeUtf8, MAX_SUBMISSION_BYTES } from '../body.ts';
import {
  parseCanonical,
  CanonicalJsonError,
  topLevelString,
  topLevelBoolean,
  withTopLevelField,
  jsonString,
  identityHash,
  isJsonObject,
  type JsonValue,
} from '../../core/canonical-json.ts';
import { forwardableHeaders, parseHops, HOPS_HEADER } from '../../core/header-policy.ts';
import { newId } from '../../core/ids.ts';
import { resolveModel } from '../../control/resolve-model.ts';
import type { Dialect } from '../../db/requests.ts';
import { MeteringRefusal, type Submitted } from '../../db/submissions.ts';
import { seal } from '../../core/sealing.ts';
import { callerCredential, credentialIdentity } from './caller-credential.ts';

export type Submission = Submitted & { streaming: boolean };

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
): Promise<Submission> {
  const settings = deps.settings.current();
  const hops = parseHops(req.headers[HOPS_HEADER]);
  if (hops >= settings.reroute_ceiling) {
    throw new ServiceError(
      'loop_detected',
      `The submission arrived at re-route depth ${hops}; the ceiling is ${settings.reroute_ceiling}.`,
    );
  }
  const { value, text } = parseBody(await readBody(req, MAX_SUBMISSION_BYTES));
  if (!isJsonObject(value)) throw new ServiceError('bad_request', 'The body must be a JSON object.');
  const model = topLevelString(value, 'model');
  if (model === undefined) throw new ServiceError('bad_request', 'The body must name a `model` as a string.');
  // The model is stored as text, which cannot hold U+0000 (the body keeps its escape as sent).
  if (model.includes('\u0000')) throw new ServiceError('bad_request', 'The `model` must not contain U+0000.');
  const streaming = topLevelBoolean(value, 'stream') === true;

  const resolution = await resolveModel(deps, auth.namespaceId, model);
  if (resolution === null) {
    throw new ServiceError('not_found', `No routing rule matches model ${JSON.stringify(model)} in namespace ${auth.namespaceName}.`);
  }
  if ('declined' in resolution) {
    throw new ServiceError('forbidden', `Routing rule ${resolution.declined.rule_id} (${resolution.declined.model}) declines model ${JSON.stringify(model)}.`);
  }
  const { rule, backend } = resolution;
  if (backend.dialect !== dialect) {
    throw new ServiceError(
      'unprocessable_entity',
      `Model ${JSON.stringify(model)} routes to a ${backend.dialect}-dialect backend; this route speaks ${dialect}. Sarsen does not translate between dialects.`,
    );
  }
  let credential: string | null = null;
  if (backend.credential_source === 'caller') {
    if (!deps.serve.credentialPassthrough) {
      throw new ServiceError('passthrough_disabled', 'This model routes to a caller-credential backend, which this deployment does not enable.');
    }
    if (opts.fireAndForget) {
      throw new ServiceError('passthrough_disabled', 'Caller-credential backends take synchronous submissions only: POST /chat/completions or /messages.');
    }
    credential = callerCredential(req.headers);
    if (credential === null) {
      throw new ServiceError(
        'caller_credential_missing',
        'This backend forwards your own provider credential: send it in Authorization or x-api-key, and the Sarsen key in X-Sarsen-Key.',
      );
    }
  }

  const upstreamModel = rule.rewrite_model ?? model;
  const body = upstreamModel === model ? text : withTopLevelField(value, 'model', jsonString(upstreamModel));
  const id = newId('req');
  const submitted = await deps.submitter
    .submit({
      id,
      tenancyId: auth.tenancyId,
      namespaceId: auth.namespaceId,
      apiKeyId: auth.apiKeyId,
      backendId: backend.backend_id,
      fallbackBackendIds: rule.fallback_backend_ids,
      backend,
      dialect,
      streaming,
      model,
      upstreamModel,
      forwardedHeaders: forwardableHeaders(dialect, req.rawHeaders),
      hops,
      body,
      identity: Buffer.from(
        identityHash({
          dialect,
          canonicalText: text,
          credentialHash: credential === null ? undefined : credentialIdentity(deps.secrets.apiKeyHashKey, credential),
        }),
        'hex',
      ),
      // Sealed under credential-key and bound to the request; destroyed with the terminal write.
      sealedCredential: credential === null ? null : seal(deps.keyring, credential, id),
      waited: !opts.fireAndForget,
    })
    .catch((err: unknown) => {
      if (err instanceof MeteringRefusal) throw new ServiceError(err.reason, err.message);
      throw err;
    });
  return { ...submitted, streaming };
}
