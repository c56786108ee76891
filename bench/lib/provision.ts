// Provisioning for benchmarks, the way an operator does it: a tenancy and owner straight into
// the database (as `sarsen tenancy create` does), then a namespace, a chat backend on the fake
// provider, a `gpt-*` routing rule and an API key through the administration routes. Takes a
// URL and a pool rather than the test harness's in-process server. `limits` gives the key rate
// limits; `cacheTtlMinutes` turns the namespace's response cache on.
import crypto from 'node:crypto';
import type pg from 'pg';
import { call, createTenancy, signInAndChoose } from '../../test/support/control-plane.ts';

export type BenchTenant = {
  tenancy: string;
  namespace: string;
  /** `{url}/{tenancy}/{namespace}/v1` */
  basePath: string;
  key: string;
};

export async function provisionChat(
  url: string,
  pool: pg.Pool,
  providerUrl: string,
  opts: { limits?: { requests_per_minute?: number; tokens_per_minute?: number }; cacheTtlMinutes?: number } = {},
): Promise<BenchTenant> {
  const tenancy = `bench-${crypto.randomBytes(3).toString('hex')}`;
  const namespace = 'main';
  const { token } = await signInAndChoose(url, await createTenancy(pool, tenancy));
  const admin = async (path: string, body: unknown) => {
    const res = await call(url, 'POST', `/${tenancy}/v1${path}`, { token, body });
    if (res.status >= 300) throw new Error(`POST ${path}: ${res.status} ${res.text}`);
    return res.body;
  };
  await admin('/namespaces', { name: namespace, ...(opts.cacheTtlMinutes ? { cache_ttl_minutes: opts.cacheTtlMinutes } : {}) });
  const ns = `/namespaces/${namespace}`;
  const backend = await admin(`${ns}/backends`, {
    name: 'chat',
    kind: 'chat_compat',
    address: `${providerUrl}/v1`,
    credential: `sk-bench-${crypto.randomBytes(12).toString('hex')}`,
  });
  await admin(`${ns}/routing-rules`, { model: 'gpt-*', backend_id: backend.backend_id });
  const key = await admin(`${ns}/api-keys`, { name: 'bench', grants: ['use'], ...(opts.limits ? { limits: opts.limits } : {}) });
  return { tenancy, namespace, basePath: `/${tenancy}/${namespace}/v1`, key: key.key as string };
}
