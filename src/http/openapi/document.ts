// The OpenAPI 3.1 document served at GET /openapi.json (and kept as openapi.json in the
// repository): every route the API role serves, with the zod schemas the routes validate their
// bodies with (converted by zod's own JSON Schema output, draft 2020-12, which OpenAPI 3.1
// uses), the answers' shapes (./schemas.ts) and the error codes each route can answer.
// test/integration/openapi.test.ts fails when a route exists that this table lacks, or the reverse.
import { z } from 'zod';
import { ERROR_CODES, type ErrorCode } from '../../core/errors.ts';
import * as ns from '../admin/namespaces.ts';
import * as bk from '../admin/backends.ts';
import * as rr from '../admin/routing-rules.ts';
import * as ak from '../admin/api-keys.ts';
import * as us from '../admin/users.ts';
import * as tn from '../admin/tenancy.ts';
import { signInSchema, passwordChangeSchema } from '../admin/console-auth.ts';
import * as s from './schemas.ts';
import { STATUSES } from '../../core/listing-filter.ts';
import { DIALECTS } from '../../core/dialects.ts';

type Auth = 'session' | 'key_use' | 'key_manage' | 'none' | 'metrics';
type Answer = { status: number; description: string; schema?: z.ZodType; sse?: boolean; ndjson?: boolean };
type Operation = {
  method: 'get' | 'post' | 'patch' | 'delete';
  path: string; // express syntax: /:tenancy/v1/...
  summary: string;
  tag: string;
  auth: Auth;
  body?: z.ZodType;
  query?: Record<string, { schema: z.ZodType; description: string }>;
  headers?: Record<string, { schema: z.ZodType; description: string }>;
  answers: Answer[];
  errors: ErrorCode[];
};

const T = '/:tenancy/v1';
const NS = `${T}/namespaces/:ns`;
const SVC = '/:tenancy/:namespace/v1';
const data = (item: z.ZodType) => z.object({ data: z.array(item) });
const noContent = (description: string): Answer => ({ status: 204, description });
const ok = (schema: z.ZodType, description = 'OK'): Answer => ({ status: 200, description, schema });
const created = (schema: z.ZodType): Answer => ({ status: 201, description: 'Created', schema });

// What every session route can answer, what every write adds, and what a key route can.
const SESSION: ErrorCode[] = ['unauthorised', 'password_change_required', 'forbidden', 'not_found', 'internal'];
const WRITE: ErrorCode[] = [...SESSION, 'bad_request', 'unsupported_media_type', 'body_too_large'];
const KEY: ErrorCode[] = ['unauthorised', 'provider_credential', 'sarsen_key_forwarded', 'forbidden', 'not_found', 'internal'];
const SUBMIT: ErrorCode[] = [
  ...KEY, 'bad_request', 'unsupported_media_type', 'body_too_large', 'caller_credential_missing', 'insufficient_credits',
  'spend_limit_reached', 'unprocessable_entity', 'passthrough_disabled', 'loop_detected', 'rate_limited',
];
// What a submission may ask of the namespace's response cache.
const cacheHeader = {
  'X-Sarsen-Cache': {
    schema: z.string().regex(/^(no-store|max-age=\d+)$/i),
    description: 'no-store: the response cache neither answers nor keeps this submission; max-age=N: serve only an answer at most N seconds old (shortens the namespace\'s cache life, never lengthens it)',
  },
};
const SYNC: ErrorCode[] = [...SUBMIT, 'upstream_failed', 'held_too_long'];
const page = {
  limit: { schema: z.number().int().min(1).max(200).default(50), description: 'rows to return, 1-200 (anything else is 400, never clamped)' },
  after: { schema: z.string(), description: 'the `next_after` of the previous page, unchanged' },
};
// The listing's filters: each optional, all given must match; a cursor continues only the
// listing with the same filters (any other is 400). Instants: epoch ms or ISO 8601 with offset.
const instant = z.union([z.number().int().min(0), z.string()]);
const exportQuery = {
  since: { schema: instant, description: 'records created at or after this instant' },
  until: { schema: instant, description: 'records created before this instant; default when the export starts' },
  with_payloads: { schema: z.enum(['true', 'false']).default('false'), description: 'add each record\'s body, answer and stream' },
  after: { schema: z.string(), description: 'continue after this request id (the last line a previous export wrote)' },
};
const listingQuery = {
  ...page,
  status: { schema: z.enum(STATUSES), description: 'only requests in this status' },
  model: { schema: z.string().min(1).max(512), description: 'only requests for this model, as the caller named it' },
  dialect: { schema: z.enum(DIALECTS), description: 'only requests of this dialect' },
  api_key_id: { schema: z.string(), description: 'only requests submitted with this key (key_...)' },
  created_since: { schema: instant, description: 'only requests created at or after this instant (epoch milliseconds or ISO 8601 with offset)' },
  created_before: { schema: instant, description: 'only requests created before this instant (epoch milliseconds or ISO 8601 with offset)' },
};

/** CRUD of one resource kind under a namespace (backends, routing rules). */
function namespaced(kind: string, tag: string, idParam: string, view: z.ZodType, create: z.ZodType, patch: z.ZodType, extra: ErrorCode[], patchExtra: ErrorCode[] = []): Operation[] {
  const base = `${NS}/${kind}`;
  return [
    { method: 'get', path: base, summary: `List ${tag.toLowerCase()}`, tag, auth: 'session', answers: [ok(data(view))], errors: SESSION },
    { method: 'post', path: base, summary: `Create a ${tag.toLowerCase().replace(/s$/, '')}`, tag, auth: 'session', body: create, answers: [created(view)], errors: [...WRITE, ...extra] },
    { method: 'get', path: `${base}/:${idParam}`, summary: 'Read one', tag, auth: 'session', answers: [ok(view)], errors: SESSION },
    { method: 'patch', path: `${base}/:${idParam}`, summary: 'Change one', tag, auth: 'session', body: patch, answers: [ok(view)], errors: [...WRITE, ...extra, ...patchExtra] },
    { method: 'delete', path: `${base}/:${idParam}`, summary: 'Delete one', tag, auth: 'session', answers: [noContent('Deleted')], errors: [...SESSION, 'conflict'] },
  ];
}

export const OPERATIONS: readonly Operation[] = [
  { method: 'get', path: '/healthz', summary: 'The process is alive', tag: 'Operations', auth: 'none', answers: [ok(z.object({ status: z.literal('ok') }))], errors: [] },
  { method: 'get', path: '/readyz', summary: 'The database is reachable and every migration applied (503 otherwise)', tag: 'Operations', auth: 'none', answers: [ok(z.object({ status: z.literal('ready') })), { status: 503, description: 'Not ready', schema: z.object({ status: z.literal('unavailable') }) }], errors: [] },
  { method: 'get', path: '/metrics', summary: 'Prometheus text exposition (bearer token when the secret file metrics-token exists)', tag: 'Operations', auth: 'metrics', answers: [{ status: 200, description: 'text/plain; version=0.0.4' }], errors: ['unauthorised'] },
  { method: 'get', path: '/openapi.json', summary: 'This document', tag: 'Operations', auth: 'none', answers: [ok(z.record(z.string(), z.unknown()))], errors: [] },

  { method: 'post', path: `${T}/sessions`, summary: 'Sign in', tag: 'Sessions', auth: 'none', body: signInSchema, answers: [created(s.session)], errors: ['unauthorised', 'bad_request', 'unsupported_media_type', 'body_too_large', 'internal'] },
  { method: 'post', path: `${T}/sessions/cookie`, summary: 'Sign in for a browser: the session goes into an HttpOnly, SameSite=Strict cookie (Secure behind HTTPS), never into the body', tag: 'Sessions', auth: 'none', body: signInSchema, answers: [created(s.cookieSession)], errors: ['unauthorised', 'forbidden', 'bad_request', 'unsupported_media_type', 'body_too_large', 'internal'] },
  { method: 'get', path: `${T}/sessions/current`, summary: 'The signed-in account', tag: 'Sessions', auth: 'session', answers: [ok(s.cookieSession)], errors: ['unauthorised', 'internal'] },
  { method: 'delete', path: `${T}/sessions/current`, summary: 'Sign out (and clear the console cookie)', tag: 'Sessions', auth: 'session', answers: [noContent('Signed out')], errors: ['unauthorised', 'internal'] },
  { method: 'post', path: `${T}/account/password`, summary: 'Choose a new password', tag: 'Sessions', auth: 'session', body: passwordChangeSchema, answers: [noContent('Changed')], errors: [...WRITE, 'password_rejected'] },

  { method: 'get', path: `${T}/tenancy`, summary: 'Read the tenancy', tag: 'Tenancy', auth: 'session', answers: [ok(s.tenancy)], errors: SESSION },
  { method: 'patch', path: `${T}/tenancy`, summary: 'Change the display name or retention', tag: 'Tenancy', auth: 'session', body: tn.patchSchema, answers: [ok(s.tenancy)], errors: WRITE },

  { method: 'get', path: `${T}/namespaces`, summary: 'List namespaces', tag: 'Namespaces', auth: 'session', answers: [ok(data(s.namespace))], errors: SESSION },
  { method: 'post', path: `${T}/namespaces`, summary: 'Create a namespace', tag: 'Namespaces', auth: 'session', body: ns.createSchema, answers: [created(s.namespace)], errors: [...WRITE, 'conflict'] },
  { method: 'get', path: NS, summary: 'Read a namespace', tag: 'Namespaces', auth: 'session', answers: [ok(s.namespace)], errors: SESSION },
  { method: 'patch', path: NS, summary: 'Change retention, spend limit or the response cache\'s life', tag: 'Namespaces', auth: 'session', body: ns.patchSchema, answers: [ok(s.namespace)], errors: WRITE },
  { method: 'delete', path: NS, summary: 'Delete a namespace with its backends, rules and keys', tag: 'Namespaces', auth: 'session', answers: [noContent('Deleted')], errors: [...SESSION, 'conflict'] },

  ...namespaced('backends', 'Backends', 'backend_id', s.backend, bk.createSchema, bk.patchSchema, ['conflict', 'backend_host_refused', 'passthrough_disabled'], ['unprocessable_entity']),
  ...namespaced('routing-rules', 'Routing rules', 'rule_id', s.rule, rr.createSchema, rr.patchSchema, ['unprocessable_entity']),

  { method: 'get', path: `${NS}/api-keys`, summary: 'List API keys', tag: 'API keys', auth: 'session', answers: [ok(data(s.apiKey))], errors: SESSION },
  { method: 'post', path: `${NS}/api-keys`, summary: 'Issue an API key (the whole key is answered once)', tag: 'API keys', auth: 'session', body: ak.createSchema, answers: [created(s.createdApiKey)], errors: [...WRITE, 'conflict'] },
  { method: 'get', path: `${NS}/api-keys/:api_key_id`, summary: 'Read an API key', tag: 'API keys', auth: 'session', answers: [ok(s.apiKey)], errors: SESSION },
  { method: 'patch', path: `${NS}/api-keys/:api_key_id`, summary: 'Change a live key\'s rate limits (grants and spend limit are fixed when a key is issued)', tag: 'API keys', auth: 'session', body: ak.patchSchema, answers: [ok(s.apiKey)], errors: WRITE },
  { method: 'delete', path: `${NS}/api-keys/:api_key_id`, summary: 'Revoke an API key', tag: 'API keys', auth: 'session', answers: [noContent('Revoked')], errors: SESSION },

  { method: 'get', path: `${NS}/route`, summary: 'Which routing rule takes a model (the router\'s own precedence)', tag: 'Routing rules', auth: 'session', query: { model: { schema: z.string(), description: 'the model a caller would send' } }, answers: [ok(s.routeMatch)], errors: [...SESSION, 'bad_request'] },
  { method: 'get', path: `${NS}/requests`, summary: 'List requests, newest first, optionally filtered (as the service listing, for a session)', tag: 'Requests', auth: 'session', query: listingQuery, answers: [ok(s.listing)], errors: [...SESSION, 'bad_request'] },
  { method: 'get', path: `${NS}/requests/:id/summary`, summary: 'One request\'s listing row, kept after the sweep (as the service route, for a session)', tag: 'Requests', auth: 'session', answers: [ok(s.listingRowSchema)], errors: SESSION },
  { method: 'get', path: `${NS}/requests/:id`, summary: 'A request record; with Accept: text/event-stream its stream replayed (as the service route, for a session)', tag: 'Requests', auth: 'session', answers: [ok(s.record), { status: 200, description: 'The stored frames with id: lines, then the live tail', sse: true }], errors: [...SESSION, 'bad_request', 'record_expired'] },
  { method: 'get', path: `${NS}/responses/:id`, summary: 'A Responses request by Sarsen\'s id or the provider\'s resp_ id: its request id, whether it runs in the background, and its attempts\' provider ids', tag: 'Requests', auth: 'session', answers: [ok(s.responseIds)], errors: SESSION },
  { method: 'post', path: `${NS}/requests/:id/cancel`, summary: 'Cancel a request (as the service route, for an admin session)', tag: 'Requests', auth: 'session', answers: [ok(s.cancelled, 'Cancelled (now, or earlier)'), { status: 202, description: 'Running: the process holding its attempt aborts it', schema: s.cancelling }], errors: [...SESSION, 'conflict'] },
  { method: 'get', path: `${NS}/requests/:id/body`, summary: 'The request body as sent upstream, exactly as stored', tag: 'Requests', auth: 'session', answers: [{ status: 200, description: 'application/json: the canonical body' }], errors: [...SESSION, 'record_expired'] },
  { method: 'get', path: `${NS}/requests/:id/answer`, summary: 'The stored answer (success or error body) byte for byte; X-Stored-Content-Type names its content type', tag: 'Requests', auth: 'session', answers: [{ status: 200, description: 'text/plain: the stored bytes' }], errors: [...SESSION, 'record_expired'] },
  { method: 'get', path: `${NS}/usage`, summary: 'Usage counters and per-key figures (as the service route, for a session)', tag: 'Requests', auth: 'session', query: { since: { schema: z.number().int().min(0), description: 'epoch milliseconds; default thirty days ago' } }, answers: [ok(s.usage)], errors: [...SESSION, 'bad_request'] },
  { method: 'get', path: `${NS}/batches`, summary: "The namespace's batches of both vendors, newest first, with their lines counted by state (the console's progress)", tag: 'Requests', auth: 'session', query: page, answers: [ok(s.consoleBatchList)], errors: [...SESSION, 'bad_request'] },
  { method: 'get', path: `${NS}/batches/:id/lines`, summary: "A batch's lines in order: custom_id, state and the request each became", tag: 'Requests', auth: 'session', query: { limit: page.limit, after: { schema: z.number().int().min(0), description: 'the line after which to continue' } }, answers: [ok(z.object({ batch: s.consoleBatch, data: s.consoleBatchLines.shape.data, next_after: s.consoleBatchLines.shape.next_after }))], errors: [...SESSION, 'bad_request'] },
  { method: 'get', path: `${NS}/storage`, summary: 'Stored bytes by kind (as the service route, for a session)', tag: 'Requests', auth: 'session', answers: [ok(s.storage)], errors: SESSION },

  { method: 'get', path: `${T}/users`, summary: 'List console accounts', tag: 'Users', auth: 'session', answers: [ok(data(s.user))], errors: SESSION },
  { method: 'post', path: `${T}/users`, summary: 'Create an account (its generated password is answered once)', tag: 'Users', auth: 'session', body: us.createSchema, answers: [created(s.createdUser)], errors: [...WRITE, 'conflict'] },
  { method: 'patch', path: `${T}/users/:user_id`, summary: 'Change role or disable', tag: 'Users', auth: 'session', body: us.patchSchema, answers: [ok(s.user)], errors: [...WRITE, 'conflict'] },
  { method: 'delete', path: `${T}/users/:user_id`, summary: 'Delete an account', tag: 'Users', auth: 'session', answers: [noContent('Deleted')], errors: [...SESSION, 'conflict'] },

  { method: 'get', path: `${T}/billing`, summary: 'Balance and metering', tag: 'Billing', auth: 'session', answers: [ok(s.billing)], errors: SESSION },
  { method: 'get', path: `${T}/billing/ledger`, summary: 'Ledger entries, newest first', tag: 'Billing', auth: 'session', query: page, answers: [ok(s.ledgerPage)], errors: [...SESSION, 'bad_request'] },

  { method: 'post', path: `${SVC}/chat/completions`, summary: 'Chat dialect: holds the connection and answers the provider\'s response (or its stream)', tag: 'Service', auth: 'key_use', body: s.providerBody, headers: cacheHeader, answers: [ok(s.providerAnswer, "The provider's answer; with \"stream\": true, its SSE stream"), { status: 200, description: 'The provider\'s own stream', sse: true }], errors: SYNC },
  { method: 'post', path: `${SVC}/messages`, summary: 'Messages dialect: likewise', tag: 'Service', auth: 'key_use', body: s.providerBody, headers: cacheHeader, answers: [ok(s.providerAnswer, "The provider's answer; with \"stream\": true, its SSE stream"), { status: 200, description: 'The provider\'s own stream', sse: true }], errors: SYNC },
  { method: 'post', path: `${SVC}/responses`, summary: 'Responses dialect (served by chat backends at {address}/responses): likewise', tag: 'Service', auth: 'key_use', body: s.providerBody, headers: cacheHeader, answers: [ok(s.providerAnswer, "The provider's answer; with \"stream\": true, its SSE stream"), { status: 200, description: 'The provider\'s own stream', sse: true }], errors: SYNC },
  { method: 'get', path: `${SVC}/responses/:id`, summary: 'A Response by Sarsen\'s id or the provider\'s resp_ id: queued or in_progress while it runs, the provider\'s final response once it ended; with stream=true its events (starting_after resumes), then the live tail', tag: 'Service', auth: 'key_use', query: { stream: { schema: z.boolean().default(false), description: 'the stored events, then the live tail' }, starting_after: { schema: z.number().int().min(0), description: 'resume after this sequence_number (with stream=true)' } }, answers: [ok(s.responseObject), { status: 200, description: 'The provider\'s events byte for byte; the dialect\'s error event when the attempt read was discarded', sse: true }], errors: [...KEY, 'bad_request', 'record_expired'] },
  { method: 'post', path: `${SVC}/responses/:id/cancel`, summary: 'Cancel a response: its provider call is aborted and it ends cancelled; one that ended answers as it stands', tag: 'Service', auth: 'key_use', answers: [ok(s.responseObject)], errors: [...KEY, 'record_expired'] },
  { method: 'delete', path: `${SVC}/responses/:id`, summary: 'Remove a finished response\'s stored body and answer, as the retention sweep does (accounting stays)', tag: 'Service', auth: 'key_use', answers: [ok(s.responseDeleted)], errors: [...KEY, 'conflict', 'record_expired'] },
  { method: 'get', path: `${SVC}/responses/:id/input_items`, summary: 'The stored request\'s input items, in the vendor\'s list shape', tag: 'Service', auth: 'key_use', query: { limit: { schema: z.number().int().min(1).max(100).default(20), description: 'items to return, 1-100' }, order: { schema: z.enum(['asc', 'desc']).default('desc'), description: 'the order of the items' }, after: { schema: z.string(), description: 'list the items after this item id' } }, answers: [ok(s.inputItemList)], errors: [...KEY, 'bad_request', 'record_expired'] },
  { method: 'post', path: `${SVC}/files`, summary: 'Upload a batch input file (multipart: file, purpose=batch), streamed and kept byte for byte', tag: 'Batches', auth: 'key_use', answers: [ok(s.fileObject)], errors: [...KEY, 'bad_request', 'body_too_large'] },
  { method: 'get', path: `${SVC}/files`, summary: "The namespace's files (input, output and error), in the vendor's list shape", tag: 'Batches', auth: 'key_use', query: { limit: { schema: z.number().int().min(1).max(10000).default(10000), description: 'files to return' }, order: { schema: z.enum(['asc', 'desc']).default('desc'), description: 'by creation' }, after: { schema: z.string(), description: 'list the files after this file id' }, purpose: { schema: z.string(), description: 'only files of this purpose' } }, answers: [ok(s.fileList)], errors: [...KEY, 'bad_request'] },
  { method: 'get', path: `${SVC}/files/:id`, summary: 'A file', tag: 'Batches', auth: 'key_use', answers: [ok(s.fileObject)], errors: KEY },
  { method: 'get', path: `${SVC}/files/:id/content`, summary: "A file's content: an input file as uploaded; an output or error file's JSONL, built from the lines' stored answers", tag: 'Batches', auth: 'key_use', answers: [{ status: 200, description: 'The bytes', ndjson: true }], errors: KEY },
  { method: 'delete', path: `${SVC}/files/:id`, summary: 'Delete a file', tag: 'Batches', auth: 'key_use', answers: [ok(s.fileDeleted)], errors: KEY },
  { method: 'post', path: `${SVC}/batches`, summary: "Start an OpenAI batch from an uploaded file: every line runs as a Sarsen request", tag: 'Batches', auth: 'key_use', body: z.looseObject({ input_file_id: z.string(), endpoint: z.enum(['/v1/chat/completions', '/v1/responses']), completion_window: z.string(), metadata: z.record(z.string(), z.string()).nullable().optional() }), answers: [ok(s.batchObject)], errors: [...KEY, 'bad_request', 'unsupported_media_type', 'body_too_large'] },
  { method: 'get', path: `${SVC}/batches`, summary: "The namespace's OpenAI batches, newest first", tag: 'Batches', auth: 'key_use', query: { limit: { schema: z.number().int().min(1).max(100).default(20), description: 'batches to return' }, after: { schema: z.string(), description: 'list the batches after this batch id' } }, answers: [ok(s.batchList)], errors: [...KEY, 'bad_request'] },
  { method: 'get', path: `${SVC}/batches/:id`, summary: 'A batch: status and request_counts from its lines', tag: 'Batches', auth: 'key_use', answers: [ok(s.batchObject)], errors: KEY },
  { method: 'post', path: `${SVC}/batches/:id/cancel`, summary: 'Cancel a batch: lines not yet started end at once, those in flight end on their own', tag: 'Batches', auth: 'key_use', answers: [ok(s.batchObject)], errors: KEY },
  { method: 'post', path: `${SVC}/messages/batches`, summary: "Start an Anthropic message batch (inline requests, up to message_batch_max_bytes): every line runs as a Sarsen request", tag: 'Batches', auth: 'key_use', body: z.looseObject({ requests: z.array(z.object({ custom_id: z.string(), params: z.looseObject({ model: z.string() }) })) }), answers: [ok(s.messageBatch)], errors: [...KEY, 'bad_request', 'unsupported_media_type', 'body_too_large'] },
  { method: 'get', path: `${SVC}/messages/batches`, summary: "The namespace's message batches, newest first", tag: 'Batches', auth: 'key_use', query: { limit: { schema: z.number().int().min(1).max(1000).default(20), description: 'batches to return' }, after_id: { schema: z.string(), description: 'the page after this batch id' }, before_id: { schema: z.string(), description: 'the page before this batch id' } }, answers: [ok(s.messageBatchList)], errors: [...KEY, 'bad_request'] },
  { method: 'get', path: `${SVC}/messages/batches/:id`, summary: 'A message batch: processing_status and request_counts from its lines', tag: 'Batches', auth: 'key_use', answers: [ok(s.messageBatch)], errors: KEY },
  { method: 'post', path: `${SVC}/messages/batches/:id/cancel`, summary: 'Cancel a message batch: lines not yet started end canceled', tag: 'Batches', auth: 'key_use', answers: [ok(s.messageBatch)], errors: KEY },
  { method: 'delete', path: `${SVC}/messages/batches/:id`, summary: 'Delete an ended message batch (its requests stay, under retention)', tag: 'Batches', auth: 'key_use', answers: [ok(s.messageBatchDeleted)], errors: [...KEY, 'conflict'] },
  { method: 'get', path: `${SVC}/messages/batches/:id/results`, summary: "An ended batch's results as JSONL, built from the lines' stored answers", tag: 'Batches', auth: 'key_use', answers: [{ status: 200, description: 'One result per line', ndjson: true }], errors: [...KEY, 'bad_request'] },
  { method: 'post', path: `${SVC}/requests`, summary: 'Submit and return at once; the request runs without the caller', tag: 'Service', auth: 'key_use', body: s.providerBody, headers: cacheHeader, query: { dialect: { schema: z.enum(DIALECTS).default('chat'), description: 'the body\'s dialect' } }, answers: [{ status: 202, description: 'Accepted', schema: s.accepted }], errors: SUBMIT },
  { method: 'get', path: `${SVC}/requests`, summary: 'List requests, newest first, optionally filtered by status, model, dialect, key and creation time (manage grant)', tag: 'Service', auth: 'key_manage', query: listingQuery, answers: [ok(s.listing)], errors: [...KEY, 'bad_request'] },
  { method: 'get', path: `${SVC}/requests/export`, summary: 'Every record, oldest first, as NDJSON streamed as it is read; with with_payloads=true the body, the answer and a stream\'s frames (manage grant)', tag: 'Service', auth: 'key_manage', query: exportQuery, answers: [{ status: 200, description: 'One line per record', schema: s.exportLine, ndjson: true }], errors: [...KEY, 'bad_request'] },
  { method: 'get', path: `${SVC}/requests/:id/summary`, summary: 'One request\'s listing row, kept after the sweep (manage grant)', tag: 'Service', auth: 'key_manage', answers: [ok(s.listingRowSchema)], errors: KEY },
  { method: 'post', path: `${SVC}/requests/:id/cancel`, summary: 'Cancel a request: a pending one ends at once; a running one\'s provider call is aborted (its record ends failed with the `cancelled` error)', tag: 'Service', auth: 'key_use', answers: [ok(s.cancelled, 'Cancelled (now, or earlier)'), { status: 202, description: 'Running: the process holding its attempt aborts it', schema: s.cancelling }], errors: [...KEY, 'conflict'] },
  { method: 'get', path: `${SVC}/requests/:id`, summary: 'A request record; with Accept: text/event-stream its stream replayed (Last-Event-ID resumes)', tag: 'Service', auth: 'key_use', answers: [ok(s.record), { status: 200, description: 'The stored frames with id: lines, then the live tail', sse: true }], errors: [...KEY, 'bad_request', 'record_expired'] },
  { method: 'get', path: `${SVC}/usage`, summary: 'Usage counters and per-key figures (manage grant)', tag: 'Service', auth: 'key_manage', query: { since: { schema: z.number().int().min(0), description: 'epoch milliseconds; default thirty days ago' } }, answers: [ok(s.usage)], errors: [...KEY, 'bad_request'] },
  { method: 'get', path: `${SVC}/storage`, summary: 'Stored bytes (manage grant)', tag: 'Service', auth: 'key_manage', answers: [ok(s.storage)], errors: KEY },
];

function jsonSchema(schema: z.ZodType, io: 'input' | 'output'): Record<string, unknown> {
  const { $schema: _, ...rest } = z.toJSONSchema(schema, { target: 'draft-2020-12', io, unrepresentable: 'any' }) as Record<string, unknown>;
  return rest;
}

/** `/:tenancy/v1` as OpenAPI writes it: `/{tenancy}/v1`. */
export const openApiPath = (expressPath: string) => expressPath.replace(/:([A-Za-z_]+)/g, '{$1}');

const SECURITY: Record<Auth, Record<string, string[]>[]> = {
  none: [],
  session: [{ session: [] }, { sessionCookie: [] }],
  key_use: [{ apiKey: [] }, { sarsenKey: [] }],
  key_manage: [{ apiKey: [] }, { sarsenKey: [] }],
  metrics: [{ metricsToken: [] }, {}],
};

/**
 * An error answer: the envelope whose `code` is one of `codes` (all of one status). Routes that
 * can answer the same codes share one entry under components.responses.
 */
function errorResponse(responses: Record<string, unknown>, status: number, codes: ErrorCode[]): { $ref: string } {
  const name = `${status}_${[...codes].sort().join('_')}`;
  if (!responses[name]) {
    const envelope = s.errorEnvelope.extend({ error: z.object({ code: z.enum(codes as [ErrorCode, ...ErrorCode[]]), message: z.string() }) });
    responses[name] = { description: codes.join(', '), content: { 'application/json': { schema: jsonSchema(envelope, 'output') } } };
  }
  return { $ref: `#/components/responses/${name}` };
}

function operation(op: Operation, shared: Record<string, unknown>): Record<string, unknown> {
  const parameters = [
    ...[...op.path.matchAll(/:([A-Za-z_]+)/g)].map((m) => ({ name: m[1], in: 'path', required: true, schema: { type: 'string' } })),
    ...Object.entries(op.query ?? {}).map(([name, q]) => ({ name, in: 'query', required: false, description: q.description, schema: jsonSchema(q.schema, 'input') })),
    ...Object.entries(op.headers ?? {}).map(([name, h]) => ({ name, in: 'header', required: false, description: h.description, schema: jsonSchema(h.schema, 'input') })),
  ];
  const responses: Record<string, unknown> = {};
  for (const a of op.answers) {
    const content: Record<string, unknown> = (responses[a.status] as { content?: Record<string, unknown> } | undefined)?.content ?? {};
    if (a.sse) content['text/event-stream'] = { schema: { type: 'string' } };
    else if (a.schema) content[a.ndjson ? 'application/x-ndjson' : 'application/json'] = { schema: jsonSchema(a.schema, 'output') };
    responses[a.status] = { description: a.description, ...(Object.keys(content).length > 0 ? { content } : {}) };
  }
  const byStatus = new Map<number, ErrorCode[]>();
  for (const code of new Set(op.errors)) byStatus.set(ERROR_CODES[code].status, [...(byStatus.get(ERROR_CODES[code].status) ?? []), code]);
  for (const [status, codes] of [...byStatus].sort((a, b) => a[0] - b[0])) responses[status] = errorResponse(shared, status, codes);
  return {
    summary: op.summary,
    tags: [op.tag],
    operationId: `${op.method}${openApiPath(op.path).replace(/[{}]/g, '').replace(/[^A-Za-z0-9]+(.)?/g, (_m, c: string | undefined) => (c ?? '').toUpperCase())}`,
    security: SECURITY[op.auth],
    ...(parameters.length > 0 ? { parameters } : {}),
    ...(op.body ? { requestBody: { required: true, content: { 'application/json': { schema: jsonSchema(op.body, 'input') } } } } : {}),
    responses,
  };
}

let built: Record<string, unknown> | null = null;

/** The document (built once per process). */
export function openApiDocument(): Record<string, unknown> {
  if (built) return built;
  const paths: Record<string, Record<string, unknown>> = {};
  const responses: Record<string, unknown> = {};
  for (const op of OPERATIONS) (paths[openApiPath(op.path)] ??= {})[op.method] = operation(op, responses);
  built = {
    openapi: '3.1.0',
    info: {
      title: 'Sarsen',
      version: '0.1.0',
      description: 'Durable inference proxy. Service routes live under /{tenancy}/{namespace}/v1 and take a Sarsen API key; administration routes live under /{tenancy}/v1 and take a console session. Every error Sarsen raises itself is {"error": {"code", "message"}}; provider refusals pass through unchanged.',
    },
    servers: [{ url: 'http://127.0.0.1:8080' }],
    components: {
      responses,
      securitySchemes: {
        session: { type: 'http', scheme: 'bearer', description: 'Authorization: Bearer ses_... (POST /{tenancy}/v1/sessions)' },
        sessionCookie: { type: 'apiKey', in: 'cookie', name: 'sarsen_session', description: 'the console\'s HttpOnly cookie (POST /{tenancy}/v1/sessions/cookie); a state-changing request carrying it must come from the same origin (Sec-Fetch-Site or Origin), else 403' },
        apiKey: { type: 'http', scheme: 'bearer', description: 'Authorization: Bearer sar_<prefix>_<secret>' },
        sarsenKey: { type: 'apiKey', in: 'header', name: 'X-Sarsen-Key', description: 'wins over Authorization when both are sent' },
        metricsToken: { type: 'http', scheme: 'bearer', description: 'the secret file metrics-token, when it exists' },
      },
    },
    paths,
  };
  return built;
}
