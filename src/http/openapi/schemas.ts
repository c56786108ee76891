// The answers' shapes for the OpenAPI document. Each is checked by the type checker against
// the function that builds that answer (`documents<ReturnType<typeof view>>()`), so a field
// added to or dropped from an answer fails `npm run typecheck` until the document follows.
import { z } from 'zod';
import { DIALECTS } from '../../core/dialects.ts';
import type { backendView } from '../admin/backends.ts';
import type { ruleView } from '../admin/routing-rules.ts';
import type { keyView } from '../admin/api-keys.ts';
import type { userView } from '../admin/users.ts';
import type { namespaceView } from '../admin/namespaces.ts';
import type { tenancyView } from '../admin/tenancy.ts';
import type { listingRow, rateLimitView } from '../service/accounts.ts';
import type { KeyUsage } from '../../db/accounting.ts';
import { ERROR_CODES } from '../../core/errors.ts';
import { ENDINGS } from '../../db/attempt-log.ts';

type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
// The same fields, and every value the schema allows is one the answer's type allows (the
// schema may name the values of a string column, say).
type Describes<S, T> = Same<keyof S, keyof T> extends true ? ([S] extends [T] ? true : false) : false;

/** Passes `schema` through when it describes `T` (see Describes); a type error otherwise. */
const documents =
  <T>() =>
  <S extends z.ZodType>(schema: S & (Describes<z.output<S>, T> extends true ? unknown : { mismatch: never })): S =>
    schema;

const time = z.string().describe('RFC 3339 UTC');
const id = (prefix: string) => z.string().describe(`${prefix}_...`);

export const errorEnvelope = z.object({
  error: z.object({ code: z.enum(Object.keys(ERROR_CODES) as [keyof typeof ERROR_CODES]), message: z.string() }),
});

export const namespace = documents<ReturnType<typeof namespaceView>>()(
  z.object({
    namespace_id: id('ns'),
    name: z.string(),
    retention_minutes: z.number().int().nullable(),
    effective_retention_minutes: z.number().int(),
    spend_limit: z.number().int().nullable(),
    cache_ttl_minutes: z.number().int().nullable().describe('how long an answer may be served from the response cache; null: no cache'),
    created_at: time.nullable(),
  }),
);

export const tenancy = documents<ReturnType<typeof tenancyView>>()(
  z.object({
    tenancy_id: id('ten'),
    slug: z.string(),
    display_name: z.string(),
    retention_minutes: z.number().int().nullable(),
    effective_retention_minutes: z.number().int(),
    created_at: time.nullable(),
  }),
);

const backendKind = z.enum(['chat_compat', 'messages', 'aggregator']);
export const backend = documents<ReturnType<typeof backendView>>()(
  z.object({
    backend_id: id('bk'),
    name: z.string(),
    kind: backendKind,
    dialect: z.enum(['chat', 'messages']).describe('fixed by the kind; a chat backend serves the chat and responses dialects'),
    address: z.string(),
    credential_source: z.enum(['stored', 'caller']),
    has_credential: z.boolean(),
    created_at: time.nullable(),
  }),
);

export const rule = documents<ReturnType<typeof ruleView>>()(
  z.object({
    rule_id: id('rule'),
    model: z.string(),
    backend_id: z.string().nullable(),
    fallback_backend_ids: z.array(z.string()).describe('tried in order after a retryable failure on the backend before'),
    rewrite_model: z.string().nullable(),
    priority: z.number().int(),
    action: z.enum(['route', 'decline']),
    created_at: time.nullable(),
  }),
);

export const apiKey = documents<ReturnType<typeof keyView>>()(
  z.object({
    api_key_id: id('key'),
    prefix: z.string(),
    name: z.string(),
    grants: z.array(z.enum(['use', 'manage'])),
    spend_limit: z.number().int().nullable(),
    limits: z
      .object({ requests_per_minute: z.number().int().nullable(), tokens_per_minute: z.number().int().nullable() })
      .describe('rate limits per minute; null: that limit is off'),
    created_at: time.nullable(),
    last_used_at: time.nullable(),
    revoked_at: time.nullable(),
  }),
);
export const createdApiKey = apiKey.extend({ key: z.string().describe('the whole key, sar_<prefix>_<secret>: answered this once') });

export const user = documents<ReturnType<typeof userView>>()(
  z.object({
    user_id: id('usr'),
    email: z.string(),
    role: z.enum(['owner', 'admin', 'viewer']),
    disabled: z.boolean(),
    password_chosen: z.boolean(),
    created_at: time.nullable(),
  }),
);
export const createdUser = user.extend({ password: z.string().describe('generated, unchosen: answered this once') });

export const session = z.object({
  token: z.string().describe('ses_...'),
  expires_at: time.nullable(),
  user_id: id('usr'),
  role: z.enum(['owner', 'admin', 'viewer']),
  password_change_required: z.boolean(),
});

export const cookieSession = z.object({
  tenancy: z.string(),
  user_id: id('usr'),
  email: z.string(),
  role: z.enum(['owner', 'admin', 'viewer']),
  expires_at: time.nullable(),
  password_change_required: z.boolean(),
});
export const routeMatch = z.object({ model: z.string(), rule: rule.nullable().describe('the rule that takes the model (it may decline it); null when none matches') });

export const billing = z.object({ tenancy_id: id('ten'), balance_micros: z.number().int(), metering_enabled: z.boolean() });
export const ledgerPage = z.object({
  data: z.array(
    z.object({
      entry_id: z.number().int(),
      namespace_id: z.string(),
      api_key_id: z.string().nullable(),
      request_id: z.string().nullable(),
      kind: z.string(),
      amount_micros: z.number().int(),
      created_at: time.nullable(),
    }),
  ),
  next_after: z.string().nullable(),
});

export const listingRowSchema = documents<ReturnType<typeof listingRow>>()(
  z.object({
    request_id: id('req'),
    status: z.enum(['pending', 'running', 'succeeded', 'failed']),
    model: z.string(),
    dialect: z.enum(DIALECTS),
    streaming: z.boolean(),
    api_key_id: z.string().nullable(),
    api_key_prefix: z.string().nullable(),
    backend_id: z.string(),
    prompt_tokens: z.number().int().nullable(),
    completion_tokens: z.number().int().nullable(),
    total_tokens: z.number().int().nullable(),
    cost: z.number().int().describe('micro-credits'),
    stored_bytes: z.number().int(),
    attempts: z.number().int(),
    recoveries: z.number().int(),
    created_at: time.nullable(),
    started_at: time.nullable(),
    finished_at: time.nullable(),
    expired: z.boolean(),
    cached_from: z.string().nullable().describe('the request whose stored answer the response cache served; null otherwise'),
    batch_id: z.string().nullable().optional().describe('the batch the request is a line of; null otherwise (not in the export)'),
  }),
);
export const listing = z.object({ data: z.array(listingRowSchema), next_after: z.string().nullable() });
// A line of GET /requests/export: the listing row, and with with_payloads=true (for a record not
// swept) its payloads, byte-exact: the body as its exact text, the answer and the stream's frames
// back to back as base64.
export const exportLine = listingRowSchema.extend({
  error_status: z.number().int().nullable(),
  request_body: z.string().nullable().optional().describe('the request body as sent upstream, exactly'),
  response_status: z.number().int().optional(),
  response_content_type: z.string().nullable().optional(),
  response_base64: z.string().optional().describe('the stored answer (success or error body), base64'),
  stream_base64: z.string().optional().describe('a streamed answer: its frames as the provider sent them, back to back, base64'),
});

const keyUsage = documents<KeyUsage>()(
  z.object({
    api_key_id: z.string(),
    ledger_events: z.number().int(),
    provider_calls: z.number().int(),
    prompt_tokens: z.number().int().nullable(),
    completion_tokens: z.number().int().nullable(),
    total_tokens: z.number().int().nullable(),
    cache_hits: z.number().int().describe('submissions answered from the response cache'),
  }),
);
const rateLimit = documents<ReturnType<typeof rateLimitView>>()(
  z.object({
    api_key_id: z.string(),
    requests_per_minute: z.number().int().nullable(),
    tokens_per_minute: z.number().int().nullable(),
    window: z
      .object({ started_at: time, requests: z.number().int(), tokens: z.number().int(), refused: z.number().int() })
      .describe('the current minute (database clock): requests accepted, tokens charged, submissions refused'),
  }),
);
export const usage = z.object({
  namespace_id: z.string(),
  itemised_since: z.number().int().describe('epoch milliseconds'),
  accepted_submissions: z.number().int(),
  provider_calls: z.number().int(),
  upstream_sent_bytes: z.number().int(),
  upstream_received_bytes: z.number().int(),
  cache_hits: z.number().int().describe('submissions answered from the response cache, all-time'),
  api_keys: z.array(keyUsage),
  rate_limits: z.array(rateLimit).describe('every live key with a rate limit'),
});
export const storage = z.object({
  namespace_id: z.string(),
  stored_bytes: z.number().int().describe('request_bytes + response_bytes + chunk_bytes'),
  request_bytes: z.number().int(),
  response_bytes: z.number().int(),
  chunk_bytes: z.number().int(),
  file_bytes: z.number().int().describe('uploaded batch input files, byte for byte (not in stored_bytes)'),
  batch_bytes: z.number().int().describe('bodies of batch lines not yet run (not in stored_bytes)'),
});

export const record = z.object({
  request_id: id('req'),
  status: z.enum(['pending', 'running', 'succeeded', 'failed']),
  dialect: z.enum(DIALECTS),
  streaming: z.boolean(),
  backend_id: z.string().describe('the backend of the latest attempt: after fallbacks, the one that answered'),
  attempts: z.number().int(),
  recoveries: z.number().int(),
  next_retry_at: time.nullable(),
  cached_from: z.string().optional().describe('only on a request answered from the response cache: the request whose answer it copied'),
  attempt_log: z
    .array(
      z.object({
        attempt: z.number().int(),
        started_at: z.string(),
        ended_at: z.string(),
        backend_id: z.string().optional().describe('absent when the backend was deleted since'),
        outcome: z.enum(ENDINGS),
        status: z.number().int().optional().describe("the provider's HTTP status"),
        retry_after: z.string().optional().describe("the provider's retry-after, verbatim"),
        error: z.string().optional().describe("a transport failure's message"),
      }),
    )
    .describe('one entry per attempt that ended, oldest first'),
  response: z.record(z.string(), z.unknown()).optional().describe('the stored answer, verbatim (non-streamed successes)'),
  error: z.record(z.string(), z.unknown()).optional().describe('the stored failure body'),
  error_status: z.number().int().optional(),
  retry_after: z.string().nullable().optional(),
});

export const accepted = z.object({
  request_id: id('req'),
  status: z.enum(['pending', 'running', 'succeeded']).describe('pending for a new request; the status of the request an identical body attached to; succeeded when answered from the response cache'),
});
export const cancelled = z.object({ request_id: id('req'), status: z.literal('failed') });
export const cancelling = z.object({ request_id: id('req'), status: z.literal('running') });
/** A provider-dialect body: passed upstream as sent (canonicalised), never validated beyond `model`. */
export const providerBody = z.looseObject({ model: z.string(), stream: z.boolean().optional() });
export const providerAnswer = z.record(z.string(), z.unknown()).describe("the provider's own answer, byte for byte");

// Background responses (docs/api.md "Background responses"): the reference vendor's shapes.
/** A Response object: the provider's own once the response ended, Sarsen's (these fields, the request's settings echoed) before. */
export const responseObject = z.looseObject({
  id: z.string(),
  object: z.literal('response'),
  created_at: z.number().int(),
  status: z.enum(['queued', 'in_progress', 'completed', 'failed', 'cancelled', 'incomplete']),
  background: z.boolean().optional(),
  model: z.string(),
  output: z.array(z.unknown()),
  error: z.object({ code: z.string(), message: z.string() }).nullable(),
}).describe("a Response in the vendor's shape; once ended, the provider's final response byte for byte");
export const responseDeleted = z.object({ id: z.string(), object: z.literal('response'), deleted: z.literal(true) });
export const inputItemList = z.object({
  object: z.literal('list'),
  data: z.array(z.looseObject({ id: z.string(), type: z.string() })),
  first_id: z.string().nullable(),
  last_id: z.string().nullable(),
  has_more: z.boolean(),
});
/** A Responses request as the console finds it by either id. */
export const responseIds = z.object({
  request_id: id('req'),
  background: z.boolean(),
  response_ids: z.array(z.object({ id: z.string(), attempt: z.number().int() })),
});

// The vendors' batch APIs (docs/api.md "Batches"), in their own shapes.
export const fileObject = z.looseObject({
  id: z.string(), object: z.literal('file'), bytes: z.number().int(), created_at: z.number().int(), filename: z.string(),
  purpose: z.enum(['batch', 'batch_output']), status: z.literal('processed'),
}).describe("OpenAI's FileObject");
export const fileList = z.object({ object: z.literal('list'), data: z.array(fileObject), first_id: z.string().nullable(), last_id: z.string().nullable(), has_more: z.boolean() });
export const fileDeleted = z.object({ id: z.string(), object: z.literal('file'), deleted: z.literal(true) });
export const batchObject = z.looseObject({
  id: z.string(), object: z.literal('batch'), endpoint: z.string(), input_file_id: z.string(), completion_window: z.string(),
  status: z.enum(['validating', 'failed', 'in_progress', 'finalizing', 'completed', 'expired', 'cancelling', 'cancelled']),
  output_file_id: z.string().nullable(), error_file_id: z.string().nullable(),
  request_counts: z.object({ total: z.number().int(), completed: z.number().int(), failed: z.number().int() }),
}).describe("OpenAI's Batch");
export const batchList = z.object({ object: z.literal('list'), data: z.array(batchObject), first_id: z.string().nullable(), last_id: z.string().nullable(), has_more: z.boolean() });
export const messageBatch = z.looseObject({
  id: z.string(), type: z.literal('message_batch'), processing_status: z.enum(['in_progress', 'canceling', 'ended']),
  request_counts: z.object({ processing: z.number().int(), succeeded: z.number().int(), errored: z.number().int(), canceled: z.number().int(), expired: z.number().int() }),
  results_url: z.string().nullable(),
}).describe("Anthropic's MessageBatch");
export const messageBatchList = z.object({ data: z.array(messageBatch), has_more: z.boolean(), first_id: z.string().nullable(), last_id: z.string().nullable() });
export const messageBatchDeleted = z.object({ id: z.string(), type: z.literal('message_batch_deleted') });
export const consoleBatch = z.object({
  id: z.string(), vendor: z.enum(['openai', 'anthropic']), endpoint: z.string(), status: z.string(), total: z.number().int(),
  counts: z.record(z.string(), z.number().int()).describe('lines by state: waiting, running, succeeded, failed, refused, canceled, expired'),
  created_at: z.string(), ended_at: z.string().nullable(), metadata: z.record(z.string(), z.string()).nullable(),
});
export const consoleBatchList = z.object({ data: z.array(consoleBatch), next_after: z.string().nullable() });
export const consoleBatchLines = z.object({
  data: z.array(z.object({ line: z.number().int(), custom_id: z.string(), state: z.string(), request_id: z.string().nullable(), error_code: z.string().nullable(), error_status: z.number().int().nullable() })),
  next_after: z.number().int().nullable(),
});
