// The accounts benchmark's namespace: provisioned through the administration routes like an
// operator's (tenancy and owner straight into the database, as `sarsen tenancy create` does),
// then filled with a large history written set-based, shaped the way the real write path leaves
// it: request rows with ULID ids that sort by creation time, one ledger entry per request, and
// the per-key hourly and all-time counters that the submission and outcome statements keep
// (src/db/submissions.ts, src/db/attempts.ts), as folded (src/db/counters.ts): ledger events in the hour of the entry,
// provider calls and tokens in the hour of the request's terminal write.
//
// Bodies, answers and frames are not stored: no measured read touches those tables, and the
// storage counters are kept equal to the per-request byte columns instead of a recount.
import crypto from 'node:crypto';
import type pg from 'pg';
import { call, createTenancy, signInAndChoose } from '../../test/support/control-plane.ts';

export type AccountsTenant = {
  tenancy: string;
  tenancyId: string;
  namespace: string;
  namespaceId: string;
  backendId: string;
  /** `/{tenancy}/{namespace}/v1` */
  basePath: string;
  /** The first key has the manage grant and is the one the benchmark reads with. */
  keys: { key: string; apiKeyId: string }[];
};

type Admin = (path: string, body: unknown) => Promise<any>;

async function provisionNamespace(admin: Admin, base: Pick<AccountsTenant, 'tenancy' | 'tenancyId'>, namespace: string, providerUrl: string, keyCount: number): Promise<AccountsTenant> {
  const ns = await admin('/namespaces', { name: namespace });
  const nsPath = `/namespaces/${namespace}`;
  const backend = await admin(`${nsPath}/backends`, {
    name: 'chat',
    kind: 'chat_compat',
    address: `${providerUrl}/v1`,
    credential: `sk-bench-${crypto.randomBytes(12).toString('hex')}`,
  });
  await admin(`${nsPath}/routing-rules`, { model: 'gpt-*', backend_id: backend.backend_id });
  const keys: AccountsTenant['keys'] = [];
  for (let i = 0; i < keyCount; i++) {
    const k = await admin(`${nsPath}/api-keys`, { name: `bench-${i}`, grants: i === 0 ? ['use', 'manage'] : ['use'] });
    keys.push({ key: k.key as string, apiKeyId: k.api_key_id as string });
  }
  return {
    ...base,
    namespace,
    namespaceId: ns.namespace_id as string,
    backendId: backend.backend_id as string,
    basePath: `/${base.tenancy}/${namespace}/v1`,
    keys,
  };
}

/**
 * The measured namespace (`main`, `keyCount` keys) and a neighbour (`other`, one key) in the
 * same tenancy: a deployment holds more than one namespace, and the planner should see that.
 */
export async function provisionAccounts(url: string, pool: pg.Pool, providerUrl: string, keyCount: number): Promise<{ main: AccountsTenant; neighbour: AccountsTenant }> {
  const tenancy = `bench-acc-${crypto.randomBytes(3).toString('hex')}`;
  const account = await createTenancy(pool, tenancy);
  const { token } = await signInAndChoose(url, account);
  const admin: Admin = async (path, body) => {
    const res = await call(url, 'POST', `/${tenancy}/v1${path}`, { token, body });
    if (res.status >= 300) throw new Error(`POST ${path}: ${res.status} ${res.text}`);
    return res.body;
  };
  const base = { tenancy, tenancyId: account.tenancy_id };
  return {
    main: await provisionNamespace(admin, base, 'main', providerUrl, keyCount),
    neighbour: await provisionNamespace(admin, base, 'other', providerUrl, 1),
  };
}

const CROCKFORD = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';

/** SQL for `digits` Crockford base32 characters of the bigint expression `v`, most significant first. */
export function base32Sql(v: string, digits: number): string {
  const parts: string[] = [];
  for (let i = digits - 1; i >= 0; i--) parts.push(`substr('${CROCKFORD}', ((${v} >> ${5 * i}) & 31)::int + 1, 1)`);
  return parts.join(' || ');
}

// Row g (1..n) of the history: created evenly over the window, oldest first, so ids (time
// first) and creation order agree. 2% failed, a quarter streamed, 1 in 40 needed a second
// attempt, and 1 in 97 successes had a provider that reported no usage (null tokens).
const REQUESTS = (ulid: string) => `
INSERT INTO sarsen.requests (id, tenancy_id, namespace_id, api_key_id, backend_id, dialect, streaming, model, upstream_model,
  status, attempts, prompt_tokens, completion_tokens, total_tokens, cost_micros, error_status,
  request_bytes, response_bytes, chunk_bytes, created_at, started_at, finished_at, provider_reached)
SELECT 'req_' || ${ulid}, $1, $2, ($3::text[])[1 + g % cardinality($3::text[])], $4, 'chat', g % 4 = 0, 'gpt-bench', 'gpt-bench',
       CASE WHEN g % 50 = 0 THEN 'failed' ELSE 'succeeded' END,
       CASE WHEN g % 40 = 0 THEN 2 ELSE 1 END,
       CASE WHEN g % 50 = 0 OR g % 97 = 0 THEN NULL ELSE 20 + g % 400 END,
       CASE WHEN g % 50 = 0 OR g % 97 = 0 THEN NULL ELSE 5 + g % 800 END,
       CASE WHEN g % 50 = 0 OR g % 97 = 0 THEN NULL ELSE 25 + g % 400 + g % 800 END,
       $5::bigint, CASE WHEN g % 50 = 0 THEN 500 END,
       120 + g % 900,
       CASE WHEN g % 4 = 0 AND g % 50 <> 0 THEN 0 ELSE 300 + g % 1500 END,
       CASE WHEN g % 4 = 0 AND g % 50 <> 0 THEN 900 + g % 3000 ELSE 0 END,
       t, t + interval '3 ms', t + make_interval(secs => (200 + g % 1800) / 1000.0), true
  FROM generate_series(1, $6::int) g,
       LATERAL (SELECT $7::bigint + (g - 1) * $8::bigint / $6::int AS ms, (random() * 1125899906842623)::bigint AS r) x,
       LATERAL (SELECT to_timestamp(x.ms / 1000.0) AS t) y`;

// The shard the watcher folds counters into (src/db/counters.ts).
const SHARD = '0';

const LEDGER = `
INSERT INTO sarsen.ledger (tenancy_id, namespace_id, api_key_id, request_id, kind, amount_micros, created_at)
SELECT q.tenancy_id, q.namespace_id, q.api_key_id, q.id, 'execution', q.cost_micros, q.created_at
  FROM sarsen.requests q WHERE q.namespace_id = $1 ORDER BY q.id`;

// sum() of an all-null group is null: a key-hour whose answers never reported tokens stays null.
const HOURLY = `
INSERT INTO sarsen.key_usage_hourly (namespace_id, api_key_id, hour, shard, ledger_events, provider_calls,
  prompt_tokens, completion_tokens, total_tokens)
SELECT namespace_id, api_key_id, hour, shard, sum(events), sum(calls), sum(prompt), sum(completion), sum(total)
  FROM (SELECT q.namespace_id, q.api_key_id, date_trunc('hour', q.created_at) AS hour, ${SHARD} AS shard,
               1 AS events, 0 AS calls, NULL::bigint AS prompt, NULL::bigint AS completion, NULL::bigint AS total
          FROM sarsen.requests q WHERE q.namespace_id = $1
        UNION ALL
        SELECT q.namespace_id, q.api_key_id, date_trunc('hour', q.finished_at), ${SHARD},
               0, 1, q.prompt_tokens, q.completion_tokens, q.total_tokens
          FROM sarsen.requests q WHERE q.namespace_id = $1) AS e
 GROUP BY 1, 2, 3, 4`;

// Upstream bytes: the body went out once per attempt; what came back is the stored answer.
const ROLLUP = `
INSERT INTO sarsen.usage_rollup (namespace_id, shard, accepted_submissions, provider_calls, upstream_sent_bytes,
  upstream_received_bytes, request_bytes, response_bytes, chunk_bytes)
SELECT q.namespace_id, ${SHARD}, count(*), count(*) FILTER (WHERE q.attempts >= 1), sum(q.request_bytes * q.attempts),
       sum(q.response_bytes + q.chunk_bytes), sum(q.request_bytes), sum(q.response_bytes), sum(q.chunk_bytes)
  FROM sarsen.requests q WHERE q.namespace_id = $1
 GROUP BY 1, 2`;

export type SeedStep = { what: string; ms: number; rows: number };

async function timed(pool: pg.Pool, steps: SeedStep[], progress: (s: string) => void, what: string, sql: string, params: unknown[]): Promise<void> {
  progress(`seed: ${what}`);
  const t0 = performance.now();
  const r = await pool.query(sql, params);
  steps.push({ what, ms: performance.now() - t0, rows: r.rowCount ?? 0 });
}

/** `rows` requests of `t`'s namespace spread evenly over the last `days` days, with their ledger entries and counters. */
export async function seedNamespace(pool: pg.Pool, t: AccountsTenant, rows: number, days: number, feeMicros: number, steps: SeedStep[], progress: (s: string) => void): Promise<void> {
  const spanMs = days * 86_400_000;
  const startMs = Date.now() - spanMs;
  const ulid = `${base32Sql('x.ms', 10)} || ${base32Sql('x.r', 10)} || ${base32Sql('g', 6)}`;
  const label = (table: string) => `${table} (${t.namespace})`;
  await timed(pool, steps, progress, label('sarsen.requests'), REQUESTS(ulid), [t.tenancyId, t.namespaceId, t.keys.map((k) => k.apiKeyId), t.backendId, feeMicros, rows, startMs, spanMs]);
  await timed(pool, steps, progress, label('sarsen.ledger'), LEDGER, [t.namespaceId]);
  await timed(pool, steps, progress, label('sarsen.key_usage_hourly'), HOURLY, [t.namespaceId]);
  await timed(pool, steps, progress, label('sarsen.usage_rollup'), ROLLUP, [t.namespaceId]);
}

/** VACUUM ANALYZE, as autovacuum would have left tables this old; answers their sizes in bytes. */
export async function settle(pool: pg.Pool, steps: SeedStep[], progress: (s: string) => void): Promise<Record<string, number>> {
  for (const table of ['requests', 'ledger', 'key_usage_hourly', 'usage_rollup']) {
    await timed(pool, steps, progress, `VACUUM ANALYZE sarsen.${table}`, `VACUUM (ANALYZE) sarsen.${table}`, []);
  }
  const { rows: sizes } = await pool.query<{ name: string; bytes: string }>(
    `SELECT c.relname AS name, pg_total_relation_size(c.oid) AS bytes FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = 'sarsen' AND c.relname IN ('requests', 'ledger', 'key_usage_hourly', 'usage_rollup')`,
  );
  return Object.fromEntries(sizes.map((s) => [s.name, Number(s.bytes)]));
}
