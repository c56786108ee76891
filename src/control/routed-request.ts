// A submission's body as the request it becomes (docs/api.md "Routing"): the routing rule that
// wins for its model, the refusals a rule or its backend gives, and the request built from it.
// The one path for both ways work arrives: a submission route calls it with the caller's key
// (http/service/submit.ts), the batch dispatcher with the batch's (executor/batch-dispatch.ts).
// A refusal is thrown as the ServiceError the route answers and the batch line ends with.
import type { BaseDeps } from '../deps.ts';
import type { NewRequest } from '../db/submissions.ts';
import type { BackendForCall } from '../db/backends.ts';
import type { KeyLimits } from '../db/rate-limits.ts';
import { ServiceError } from '../core/errors.ts';
import { servesDialect, type Dialect } from '../core/dialects.ts';
import { identityHash, parseCanonical, withTopLevelField, jsonString, type JsonValue } from '../core/canonical-json.ts';
import { credentialIdentity } from '../core/api-keys.ts';
import { seal } from '../core/sealing.ts';
import { newId } from '../core/ids.ts';
import { resolveModel } from './resolve-model.ts';

/** A body that passed its own checks (JSON, a usable `model`), and whose key sends it. */
export type SubmittedBody = {
  tenancyId: string;
  namespaceId: string;
  apiKeyId: string;
  limits: KeyLimits | null;
  dialect: Dialect;
  model: string;
  /** The canonical text; `value` its parse, when the caller has it (parsed again only to rewrite the model). */
  text: string;
  value: JsonValue | null;
  streaming: boolean;
};

/** Where the body came from, as its refusals name it. */
export type Origin = {
  /** The namespace as a refusal names it: `namespace prod` on a route, `this namespace` for a batch line. */
  namespace: string;
  /** What speaks the body's dialect: `this route`, `this batch`. */
  speaker: string;
  /** A caller waits on this connection (only such a call may go to a caller-credential backend). */
  synchronous: boolean;
  /** The provider credential the call brought, for a caller-credential backend. */
  credential: string | null;
};

/** The request a body becomes, less what only its origin knows (headers, hops, cache, owner). */
export type RoutedRequest = Omit<NewRequest, 'forwardedHeaders' | 'hops' | 'owner' | 'precounted' | 'cache' | 'traceParent'> & {
  backend: BackendForCall;
};

/** Resolves the body's model and builds its request; throws the refusal Sarsen answers it with. */
export async function routedRequest(
  deps: Pick<BaseDeps, 'pool' | 'bus' | 'serve' | 'secrets' | 'keyring'>,
  b: SubmittedBody,
  from: Origin,
): Promise<RoutedRequest> {
  const resolution = await resolveModel(deps, b.namespaceId, b.model);
  if (resolution === null) {
    throw new ServiceError('not_found', `No routing rule matches model ${JSON.stringify(b.model)} in ${from.namespace}.`);
  }
  if ('declined' in resolution) {
    throw new ServiceError('forbidden', `Routing rule ${resolution.declined.rule_id} (${resolution.declined.model}) declines model ${JSON.stringify(b.model)}.`);
  }
  const { rule, backend } = resolution;
  if (!servesDialect(backend.dialect, b.dialect)) {
    throw new ServiceError(
      'unprocessable_entity',
      `Model ${JSON.stringify(b.model)} routes to a ${backend.dialect}-dialect backend; ${from.speaker} speaks ${b.dialect}. Sarsen does not translate between dialects.`,
    );
  }
  let credential: string | null = null;
  if (backend.credential_source === 'caller') {
    if (!deps.serve.credentialPassthrough) {
      throw new ServiceError('passthrough_disabled', 'This model routes to a caller-credential backend, which this deployment does not enable.');
    }
    if (!from.synchronous) {
      throw new ServiceError('passthrough_disabled', 'Caller-credential backends take synchronous submissions only: POST /chat/completions, /messages or /responses.');
    }
    credential = from.credential;
    if (credential === null) {
      throw new ServiceError(
        'caller_credential_missing',
        'This backend forwards your own provider credential: send it in Authorization or x-api-key, and the Sarsen key in X-Sarsen-Key.',
      );
    }
  }

  const upstreamModel = rule.rewrite_model ?? b.model;
  const body = upstreamModel === b.model ? b.text : withTopLevelField(b.value ?? parseCanonical(b.text).value, 'model', jsonString(upstreamModel));
  const id = newId('req');
  const identity = Buffer.from(
    identityHash({
      dialect: b.dialect,
      canonicalText: b.text,
      credentialHash: credential === null ? undefined : credentialIdentity(deps.secrets.apiKeyHashKey, credential),
    }),
    'hex',
  );
  return {
    id,
    tenancyId: b.tenancyId,
    namespaceId: b.namespaceId,
    apiKeyId: b.apiKeyId,
    backendId: backend.backend_id,
    fallbackBackendIds: rule.fallback_backend_ids,
    backend,
    dialect: b.dialect,
    streaming: b.streaming,
    model: b.model,
    upstreamModel,
    body,
    identity,
    // Sealed under credential-key and bound to the request; destroyed with the terminal write.
    sealedCredential: credential === null ? null : seal(deps.keyring, credential, id),
    limits: b.limits,
  };
}
