// Prometheus metrics (prom-client), one registry per process, `sarsen_` prefix. Instrumented
// code calls the small functions below, each a counter or histogram update in memory: nothing
// here reads the database on a request's path. Gauges that need a look elsewhere (pools, the
// requests by state) are read when scraped, through sources the composition root registers.
//
// Label values are bounded: route patterns, dialects, backend kinds, status classes, error
// codes, reasons. Never a request id, a key, a prompt or a model name.
import client from 'prom-client';

export const registry = new client.Registry();
client.collectDefaultMetrics({ register: registry, prefix: 'sarsen_' });

const counter = (name: string, help: string, labelNames: string[] = []) => new client.Counter({ name, help, labelNames, registers: [registry] });
const histogram = (name: string, help: string, buckets: number[], labelNames: string[] = []) =>
  new client.Histogram({ name, help, buckets, labelNames, registers: [registry] });

// Seconds: from a millisecond up to the five-minute synchronous hold.
const LATENCY = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

const submissions = counter('sarsen_submissions_total', 'Submissions by route, dialect and outcome (new execution, attached, cached: answered from the response cache, refused with its error code).', ['route', 'dialect', 'outcome', 'code']);
const rateLimited = counter('sarsen_rate_limited_total', 'Submissions refused by their key\'s rate limit (429 rate_limited), by the limit reached (requests, tokens).', ['limit']);
const heldTooLong = counter('sarsen_held_too_long_total', 'Synchronous waits that ended in 504 held_too_long.', ['route']);
const httpRequests = histogram('sarsen_http_request_duration_seconds', 'HTTP requests by route pattern, method and status class, and how long they took.', LATENCY, ['route', 'method', 'status_class']);
const providerCalls = histogram('sarsen_provider_call_duration_seconds', 'Provider calls by backend kind and status class (transport: no HTTP answer), time to the response headers.', LATENCY, ['backend_kind', 'status_class']);
const retries = counter('sarsen_retries_total', 'Provider attempts that will be retried, by reason (the provider status, or transport).', ['reason']);
const recoveries = counter('sarsen_recoveries_total', 'Requests this process re-dispatched from a dead or expired attempt (recovery sweep).');
const handBacks = counter('sarsen_hand_backs_total', 'Attempts this process handed back, by reason.', ['reason']);
const acceptanceToCall = histogram('sarsen_acceptance_to_provider_call_seconds', 'Time from a request\'s acceptance to its first provider call.', LATENCY);
const firstFrame = histogram('sarsen_time_to_first_frame_seconds', 'Time from a streamed request\'s acceptance to its first frame from the provider (first attempts).', LATENCY);
const framesStored = counter('sarsen_frames_stored_total', 'Stream frames committed by the chunk writer.');
const groupCommits = counter('sarsen_group_commits_total', 'Group-commit statements of the submission and terminal writers, by writer and lane (lane 1: the spare that opens beside a flush in flight).', ['writer', 'lane']);
const flushFrames = histogram('sarsen_chunk_flush_frames', 'Frames per chunk-writer flush.', [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000, 10000]);
const flushSeconds = histogram('sarsen_chunk_flush_duration_seconds', 'Chunk-writer flush latency (statement and commit).', LATENCY);
const streams = new client.Gauge({ name: 'sarsen_streams', help: 'Streams open to callers now: live (a streaming submission) or replay (by id).', labelNames: ['kind'], registers: [registry] });
streams.set({ kind: 'live' }, 0);
streams.set({ kind: 'replay' }, 0);
const busReconnects = counter('sarsen_bus_reconnects_total', 'Times the event bus re-established its LISTEN connection.');
const discardedConnections = counter('sarsen_database_connections_discarded_total', 'Database connections destroyed because a round trip on them missed its deadline, by purpose (main, bus, queue, writers, or the name of a connection outside the budget).', ['purpose']);
const sweeps = counter('sarsen_sweeps_total', 'Sweep passes by sweep (recovery, retention) and result (ok, failed).', ['sweep', 'result']);
const swept = counter('sarsen_swept_total', 'What sweeps did: recovered requests, and expired records, claims, listing rows and ledger entries.', ['kind']);

export type SubmissionOutcome = 'new' | 'attached' | 'cached' | 'refused';

export function countSubmission(route: string, dialect: string, outcome: SubmissionOutcome, code = ''): void {
  submissions.inc({ route, dialect, outcome, code });
}

export function countRateLimited(limit: 'requests' | 'tokens'): void {
  rateLimited.inc({ limit });
}

export function countHeldTooLong(route: string): void {
  heldTooLong.inc({ route });
}

export function observeHttp(route: string, method: string, status: number, seconds: number): void {
  httpRequests.observe({ route, method, status_class: `${Math.floor(status / 100)}xx` }, seconds);
}

/** A provider call that answered `status` (or null: no HTTP answer), `startedAt` from performance.now(). */
export function observeProviderCall(backendKind: string, status: number | null, startedAt: number): void {
  const statusClass = status === null ? 'transport' : `${Math.floor(status / 100)}xx`;
  providerCalls.observe({ backend_kind: backendKind, status_class: statusClass }, (performance.now() - startedAt) / 1000);
}

export function countRetry(reason: number | 'transport'): void {
  retries.inc({ reason: String(reason) });
}

export function countRecoveries(n: number): void {
  recoveries.inc(n);
  swept.inc({ kind: 'recovered' }, n);
}

export function countHandBack(reason: string): void {
  handBacks.inc({ reason });
}

/** `acceptedAt` in epoch ms (a request id's time). */
export function observeAcceptanceToCall(acceptedAt: number): void {
  acceptanceToCall.observe(Math.max(0, Date.now() - acceptedAt) / 1000);
}

export function observeFirstFrame(acceptedAt: number): void {
  firstFrame.observe(Math.max(0, Date.now() - acceptedAt) / 1000);
}

/** A group-commit statement of `writer` on `lane`. */
export function countGroupCommit(writer: 'submissions' | 'terminals', lane: number): void {
  groupCommits.inc({ writer, lane: String(lane) });
}

export function observeFlush(frames: number, stored: number, startedAt: number): void {
  flushFrames.observe(frames);
  flushSeconds.observe((performance.now() - startedAt) / 1000);
  framesStored.inc(stored);
}

/** Counts a stream to a caller for as long as `run` runs. */
export async function trackStream<T>(kind: 'live' | 'replay', run: () => Promise<T>): Promise<T> {
  streams.inc({ kind });
  try {
    return await run();
  } finally {
    streams.dec({ kind });
  }
}

export function countBusReconnect(): void {
  busReconnects.inc();
}

export function countDiscardedConnection(purpose: string): void {
  discardedConnections.inc({ purpose });
}

export function countSweep(sweep: 'recovery' | 'retention', ok: boolean): void {
  sweeps.inc({ sweep, result: ok ? 'ok' : 'failed' });
}

export function countExpired(counts: Record<string, number>): void {
  for (const [kind, n] of Object.entries(counts)) if (n > 0) swept.inc({ kind: `expired_${kind}` }, n);
}

// --- gauges read at scrape time -------------------------------------------------------------

type PoolLike = { totalCount: number; idleCount: number; waitingCount: number };
const pools = new Map<PoolLike, string>();

new client.Gauge({
  name: 'sarsen_db_pool_connections',
  help: 'Database pool connections by pool and state (in_use, idle, waiting: callers queued for a connection).',
  labelNames: ['pool', 'state'],
  registers: [registry],
  collect() {
    this.reset();
    for (const [pool, name] of pools) {
      this.inc({ pool: name, state: 'in_use' }, pool.totalCount - pool.idleCount);
      this.inc({ pool: name, state: 'idle' }, pool.idleCount);
      this.inc({ pool: name, state: 'waiting' }, pool.waitingCount);
    }
  },
});

/** Reports a pool under `name` until the returned function is called. */
export function registerPool(name: string, pool: PoolLike): () => void {
  pools.set(pool, name);
  return () => void pools.delete(pool);
}

type StateCounts = () => Promise<Record<string, number>>;
const stateSources = new Set<StateCounts>();
// A scrape reads the database at most this often; scrapes in between get the last figures.
const STATE_READ_EVERY_MS = 1000;
let lastRead: { at: number; counts: Promise<Record<string, number>> } | null = null;

new client.Gauge({
  name: 'sarsen_requests',
  help: 'Requests in a live state (pending, running), deployment-wide, read from the database at scrape time.',
  labelNames: ['state'],
  registers: [registry],
  async collect() {
    this.reset();
    const source = stateSources.values().next().value;
    if (!source) return;
    if (!lastRead || Date.now() - lastRead.at >= STATE_READ_EVERY_MS) lastRead = { at: Date.now(), counts: source() };
    const counts = await lastRead.counts.catch(() => null);
    if (counts === null) lastRead = null;
    for (const [state, n] of Object.entries(counts ?? {})) this.set({ state }, n);
  },
});

/** The database read behind `sarsen_requests`, until the returned function is called. */
export function registerRequestStates(source: StateCounts): () => void {
  stateSources.add(source);
  lastRead = null;
  return () => {
    stateSources.delete(source);
    lastRead = null;
  };
}

export async function exposition(): Promise<{ contentType: string; body: string }> {
  return { contentType: registry.contentType, body: await registry.metrics() };
}

type Counts = Readonly<Record<string, number>>;
const connectionSources = new Map<() => Counts | null, Counts>();

const byPurpose = (pick: (open: Counts, budget: Counts) => Counts) => {
  const sum = new Map<string, number>();
  for (const [open, budget] of connectionSources) {
    for (const [purpose, n] of Object.entries(pick(open() ?? {}, budget))) sum.set(purpose, (sum.get(purpose) ?? 0) + n);
  }
  return sum;
};

new client.Gauge({
  name: 'sarsen_database_connections',
  help: 'Database connections this process holds now, by purpose (main pool, bus, graphile-worker queue, group-commit writers; other: startup migrations).',
  labelNames: ['purpose'],
  registers: [registry],
  collect() {
    this.reset();
    for (const [purpose, n] of byPurpose((open) => open)) this.set({ purpose }, n);
  },
});

new client.Gauge({
  name: 'sarsen_database_connections_budget',
  help: 'The most database connections this process may hold, by purpose (--database-connections split by role).',
  labelNames: ['purpose'],
  registers: [registry],
  collect() {
    this.reset();
    for (const [purpose, n] of byPurpose((_, budget) => budget)) this.set({ purpose }, n);
  },
});

/** Reports a process's open connections (read at scrape time) and its budget until the returned function is called. */
export function registerConnections(open: () => Counts | null, budget: Counts): () => void {
  connectionSources.set(open, budget);
  return () => void connectionSources.delete(open);
}

// The GenAI client metrics of the OpenTelemetry semantic conventions, under their conventional
// names as a Prometheus exposition writes them (dots become underscores, the unit a suffix) and
// with their advisory buckets (docs/operations.md "Metrics"). The conventions' request model is
// left out: it is caller text (a rule may take a wildcard), which labels never carry; spans have it.
const TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864];
const DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92];
const GENAI_LABELS = ['gen_ai_operation_name', 'gen_ai_provider_name'];
const tokenUsage = histogram('gen_ai_client_token_usage', 'GenAI client metric gen_ai.client.token.usage ({token}): input and output tokens per provider call.', TOKEN_BUCKETS, [...GENAI_LABELS, 'gen_ai_token_type']);
const operationDuration = histogram('gen_ai_client_operation_duration_seconds', 'GenAI client metric gen_ai.client.operation.duration (s): each provider call, to the end of its answer.', DURATION_BUCKETS, [...GENAI_LABELS, 'error_type']);

/** One provider call (`startedAt` from performance.now(); `errorType` null when it succeeded) and its tokens. */
export function observeGenAiCall(operation: string, provider: string, startedAt: number, errorType: string | null, input: number | null, output: number | null): void {
  const labels = { gen_ai_operation_name: operation, gen_ai_provider_name: provider };
  operationDuration.observe({ ...labels, error_type: errorType ?? '' }, (performance.now() - startedAt) / 1000);
  if (input !== null) tokenUsage.observe({ ...labels, gen_ai_token_type: 'input' }, input);
  if (output !== null) tokenUsage.observe({ ...labels, gen_ai_token_type: 'output' }, output);
}
