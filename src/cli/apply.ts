// `sarsen apply FILE [--prune] [--dry-run]`: configuration as code. The file (YAML or JSON)
// declares a tenancy's namespaces, backends, routing rules (their backend and fallbacks named)
// and API keys; it is validated with the same zod schemas and checks the administration routes
// use, every error naming its path in the file.
// Credentials are references (`env:NAME`, `file:PATH`), never values. The changes are planned
// (src/control/apply-plan.ts), printed, and made in one transaction; keys it issues are
// printed once. Applying the same file again changes nothing.
import fs from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { parseDocument } from 'yaml';
import type { OpenDatabase } from './database.ts';
import { ConfigError } from '../config/config.ts';
import { createPool, withTransaction, type Pool, type PoolClient } from '../db/pool.ts';
import { migrate } from '../db/migrate.ts';
import { findTenancyBySlug } from '../db/tenancies.ts';
import { listNamespaces, insertNamespace, updateNamespace, deleteNamespace } from '../db/namespaces.ts';
import { listBackends, loadBackendForCall, insertBackend, updateBackend, deleteBackend } from '../db/backends.ts';
import { listRules, insertRule, updateRule, deleteRule } from '../db/routing-rules.ts';
import { listApiKeys, insertApiKey, revokeApiKey, setApiKeyLimits } from '../db/api-keys.ts';
import { isForeignKeyViolation } from '../db/pg-errors.ts';
import { loadSettings } from '../db/settings.ts';
import { createKeyring, seal, type Keyring } from '../core/sealing.ts';
import { newId } from '../core/ids.ts';
import { generateApiKey, hashApiKeySecret } from '../core/api-keys.ts';
import { checkHostAllowed } from '../core/address-policy.ts';
import { dialectOfKind, normaliseBackendAddress, openBackendCredential } from '../control/backends.ts';
import { fallbackMismatch, chainBrokenByEdit, type ChainMember } from '../control/fallback-chains.ts';
import { planApply, describeChange, type Change, type CurrentNamespace, type DesiredKey, type DesiredNamespace, type BackendRef } from '../control/apply-plan.ts';
import * as nsRoutes from '../http/admin/namespaces.ts';
import * as bkRoutes from '../http/admin/backends.ts';
import * as rrRoutes from '../http/admin/routing-rules.ts';
import * as akRoutes from '../http/admin/api-keys.ts';

const USAGE = 'usage: sarsen apply FILE [--prune] [--dry-run] [--credential-passthrough]';

// A credential is a reference: the value itself never sits in the file.
const reference = z
  .string()
  .regex(/^(env:[A-Za-z_][A-Za-z0-9_]*|file:.+)$/, 'must be a reference, env:NAME or file:PATH (the credential itself never goes in the file)');

const unique = <T>(key: (item: T) => string, what: string) => (items: T[], ctx: z.RefinementCtx) => {
  const seen = new Map<string, number>();
  items.forEach((item, i) => {
    const k = key(item);
    if (seen.has(k)) ctx.addIssue({ code: 'custom', path: [i], message: `repeats the ${what} ${JSON.stringify(k)} of item ${seen.get(k)}` });
    else seen.set(k, i);
  });
};

// The administration routes' own payload schemas, with names for ids and references for credentials.
const backendEntry = bkRoutes.createSchema.omit({ credential: true }).extend({ credential: reference.optional() });
const ruleEntry = rrRoutes.createSchema.omit({ backend_id: true, fallback_backend_ids: true }).extend({
  backend: z.string().min(1).nullable().optional(),
  fallback_backends: z.array(z.string().min(1)).max(8, 'at most 8 fallback backends').optional(),
});
const namespaceEntry = nsRoutes.createSchema.extend({
  backends: z.array(backendEntry).default([]).superRefine(unique((b) => b.name, 'name')),
  routing_rules: z.array(ruleEntry).default([]).superRefine(unique((r) => r.model, 'model')),
  api_keys: z.array(akRoutes.createSchema).default([]).superRefine(unique((k) => k.name, 'name')),
});
export const applyFileSchema = z.strictObject({
  tenancy: z.string().min(1),
  namespaces: z.array(namespaceEntry).superRefine(unique((n) => n.name, 'name')),
});
type ApplyFile = z.output<typeof applyFileSchema>;

/** `namespaces[0].backends[1].credential` */
function where(p: readonly PropertyKey[]): string {
  return p.reduce<string>((s, k) => (typeof k === 'number' ? `${s}[${k}]` : s ? `${s}.${String(k)}` : String(k)), '') || '(the file)';
}

function fail(file: string, problems: string[]): never {
  throw new ConfigError(`${file}: ${problems.length === 1 ? problems[0] : `${problems.length} problems:\n  ${problems.join('\n  ')}`}`);
}

/** Reads and validates the file: YAML (of which JSON is a part). */
export function readApplyFile(file: string): ApplyFile {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    throw new ConfigError(`${file}: cannot be read (${(err as NodeJS.ErrnoException).code ?? 'error'}).`);
  }
  const doc = parseDocument(text, { prettyErrors: true, uniqueKeys: true });
  if (doc.errors.length > 0) {
    fail(file, doc.errors.map((e) => {
      const at = e.linePos?.[0];
      return `line ${at?.line ?? '?'}, column ${at?.col ?? '?'}: ${e.message.split(' at line ')[0]!.split('\n')[0]}`;
    }));
  }
  const parsed = applyFileSchema.safeParse(doc.toJS());
  if (!parsed.success) {
    fail(file, parsed.error.issues.map((i) => {
      if (i.code === 'unrecognized_keys') return `${where(i.path)}: unknown field${i.keys.length > 1 ? 's' : ''} ${i.keys.map((k) => JSON.stringify(k)).join(', ')}`;
      return `${where(i.path)}: ${i.message}`;
    }));
  }
  return parsed.data;
}

/** The value behind `env:NAME` or `file:PATH` (relative to the file's folder; a trailing newline is not part of it). */
function resolveReference(ref: string, baseDir: string, at: string, env: NodeJS.ProcessEnv): string {
  if (ref.startsWith('env:')) {
    const value = env[ref.slice(4)];
    if (value === undefined || value === '') throw new ConfigError(`${at}: the environment variable ${ref.slice(4)} is not set.`);
    return value;
  }
  const file = path.resolve(baseDir, ref.slice(5));
  try {
    return fs.readFileSync(file, 'utf8').replace(/\r?\n$/, '');
  } catch (err) {
    throw new ConfigError(`${at}: the credential file ${file} cannot be read (${(err as NodeJS.ErrnoException).code ?? 'error'}).`);
  }
}

/** The file's namespaces as the plan wants them: references resolved, addresses normalised and checked, defaults filled in. */
async function desiredState(cfg: ApplyFile, opts: { baseDir: string; env: NodeJS.ProcessEnv; publicOnly: boolean; passthrough: boolean }): Promise<DesiredNamespace[]> {
  const out: DesiredNamespace[] = [];
  for (const [n, ns] of cfg.namespaces.entries()) {
    const backends: DesiredNamespace['backends'] = [];
    for (const [b, bk] of ns.backends.entries()) {
      const at = `namespaces[${n}].backends[${b}]`;
      const address = normaliseBackendAddress(bk.address);
      if (!address.ok) throw new ConfigError(`${at}.address: ${address.reason}`);
      if (opts.publicOnly) {
        const verdict = await checkHostAllowed(address.hostname);
        if (!verdict.ok) throw new ConfigError(`${at}.address: refused, ${verdict.reason} (this deployment reaches only public addresses: setting backends_public_only).`);
      }
      const source = bk.credential_source ?? 'stored';
      if (source === 'caller' && bk.credential !== undefined) throw new ConfigError(`${at}.credential: a caller-credential backend holds no credential of its own.`);
      if (source === 'caller' && !opts.passthrough) throw new ConfigError(`${at}.credential_source: caller-credential backends need --credential-passthrough.`);
      const credential = bk.credential === undefined ? null : resolveReference(bk.credential, opts.baseDir, `${at}.credential`, opts.env);
      backends.push({ name: bk.name, kind: bk.kind, address: address.address, credential_source: source, credential });
    }
    const routing_rules = ns.routing_rules.map((r, i) => {
      const at = `namespaces[${n}].routing_rules[${i}]`;
      const action = r.action ?? 'route';
      const backend = r.backend ?? null;
      if (action === 'route' && backend === null) throw new ConfigError(`${at}.backend: required when action is "route".`);
      if (action === 'decline' && (backend !== null || r.rewrite_model != null)) throw new ConfigError(`${at}: a declining rule names neither a backend nor a rewrite_model.`);
      const named = (name: string, field: string) => {
        const b = backends.find((x) => x.name === name);
        if (!b) throw new ConfigError(`${at}.${field}: no backend named ${JSON.stringify(name)} in namespace ${ns.name}.`);
        return { dialect: dialectOfKind(b.kind), credential_source: b.credential_source };
      };
      const fallbacks = r.fallback_backends ?? [];
      if (action === 'decline' && fallbacks.length > 0) throw new ConfigError(`${at}.fallback_backends: a declining rule routes nowhere.`);
      if (backend !== null) {
        const primary = named(backend, 'backend');
        // The administration route's checks, by name.
        fallbacks.forEach((name, f) => {
          const field = `fallback_backends[${f}]`;
          if (name === backend || fallbacks.indexOf(name) !== f) throw new ConfigError(`${at}.${field}: ${JSON.stringify(name)} is named twice (or is the rule's backend).`);
          const why = fallbackMismatch(primary, named(name, field));
          if (why !== null) throw new ConfigError(`${at}.${field}: ${JSON.stringify(name)} ${why}.`);
        });
      }
      return { model: r.model, backend, fallbacks, rewrite_model: r.rewrite_model ?? null, priority: r.priority ?? 0, action };
    });
    const api_keys = ns.api_keys.map((k) => ({
      name: k.name,
      grants: k.grants.includes('manage') ? (['use', 'manage'] as const).slice() : ['use' as const],
      spend_limit: k.spend_limit ?? null,
      limits: akRoutes.storedLimits(k.limits),
    }));
    out.push({
      name: ns.name, retention_minutes: ns.retention_minutes ?? null, spend_limit: ns.spend_limit ?? null, cache_ttl_minutes: ns.cache_ttl_minutes ?? null,
      backends, routing_rules, api_keys,
    });
  }
  return out;
}

async function currentState(pool: Pool, tenancyId: string, keyring: Keyring): Promise<CurrentNamespace[]> {
  const out: CurrentNamespace[] = [];
  for (const ns of await listNamespaces(pool, tenancyId)) {
    const backends: CurrentNamespace['backends'] = [];
    for (const b of await listBackends(pool, ns.id)) {
      const sealed = await loadBackendForCall(pool, b.id);
      backends.push({ id: b.id, name: b.name, kind: b.kind, address: b.address, credential_source: b.credential_source, credential: sealed ? openBackendCredential(keyring, sealed) : null });
    }
    const rules = (await listRules(pool, ns.id)).map((r) => ({ id: r.id, model: r.model, backend_id: r.backend_id, fallback_backend_ids: r.fallback_backend_ids, rewrite_model: r.rewrite_model, priority: r.priority, action: r.action }));
    const keys = (await listApiKeys(pool, ns.id))
      .filter((k) => k.revoked_at === null)
      .map((k) => ({ id: k.id, name: k.name, grants: k.grants, spend_limit: k.spend_limit, limits: { requests_per_minute: k.requests_per_minute, tokens_per_minute: k.tokens_per_minute } }));
    out.push({
      id: ns.id, name: ns.name, retention_minutes: ns.retention_minutes, spend_limit: ns.spend_limit, cache_ttl_minutes: ns.cache_ttl_minutes,
      backends, routing_rules: rules, api_keys: keys,
    });
  }
  return out;
}

type Issued = { ns: string; name: string; key: string };

/** Makes the changes in one transaction; answers the keys it issued. */
async function execute(tx: PoolClient, tenancyId: string, changes: readonly Change[], keyring: Keyring, hashKey: Buffer): Promise<Issued[]> {
  const nsIds = new Map((await listNamespaces(tx, tenancyId)).map((n) => [n.name, n.id]));
  const created = new Map<string, string>(); // `${ns}/${backend name}` -> id of a backend made here
  const backendId = (ns: string, ref: NonNullable<BackendRef>) => ('id' in ref ? ref.id : created.get(`${ns}/${ref.name}`)!);
  const issued: Issued[] = [];
  const issue = async (ns: string, k: DesiredKey) => {
    const g = generateApiKey();
    await insertApiKey(tx, {
      id: newId('key'), namespace_id: nsIds.get(ns)!, name: k.name, prefix: g.prefix, secret_hash: hashApiKeySecret(hashKey, g.prefix, g.secret),
      grants: k.grants, spend_limit: k.spend_limit, ...k.limits,
    });
    issued.push({ ns, name: k.name, key: g.key });
  };
  const edited: { ns: string; nsId: string; id: string; member: ChainMember }[] = [];
  for (const c of changes) {
    const nsId = nsIds.get(c.ns)!;
    if (c.what === 'namespace') {
      if (c.op === 'create') {
        const { retention_minutes, spend_limit, cache_ttl_minutes } = c.desired;
        const row = await insertNamespace(tx, { id: newId('ns'), tenancy_id: tenancyId, name: c.ns, retention_minutes, spend_limit, cache_ttl_minutes });
        nsIds.set(c.ns, row.id);
      } else if (c.op === 'update') {
        const { retention_minutes, spend_limit, cache_ttl_minutes } = c.desired;
        await updateNamespace(tx, c.id, { retention_minutes, spend_limit, cache_ttl_minutes });
      }
      else if (!(await deleteNamespace(tx, c.id).catch(refused(`namespace ${c.ns}: other records (requests, the ledger) still refer to it`)))) throw new ConfigError(`namespace ${c.ns} is gone.`);
    } else if (c.what === 'backend') {
      if (c.op === 'delete') {
        await deleteBackend(tx, nsId, c.id).catch(refused(`backend ${c.ns}/${c.name}: routing rules the file does not name still use it`));
        continue;
      }
      const d = c.desired;
      const id = c.op === 'create' ? newId('bk') : c.id;
      const fields = { name: d.name, kind: d.kind, dialect: dialectOfKind(d.kind), address: d.address, credential_source: d.credential_source, credential_sealed: d.credential === null ? null : seal(keyring, d.credential, id) };
      if (c.op === 'create') created.set(`${c.ns}/${d.name}`, (await insertBackend(tx, { id, namespace_id: nsId, ...fields })).id);
      else {
        await updateBackend(tx, nsId, id, fields);
        if (c.fields.includes('kind') || c.fields.includes('credential_source')) edited.push({ ns: c.ns, nsId, id, member: fields });
      }
    } else if (c.what === 'rule') {
      if (c.op === 'delete') await deleteRule(tx, nsId, c.id);
      else {
        const fields = { model: c.desired.model, backend_id: c.backend && backendId(c.ns, c.backend), fallback_backend_ids: c.fallbacks.map((f) => backendId(c.ns, f)), rewrite_model: c.desired.rewrite_model, priority: c.desired.priority, action: c.desired.action };
        if (c.op === 'create') await insertRule(tx, { id: newId('rule'), namespace_id: nsId, ...fields });
        else await updateRule(tx, nsId, c.id, fields);
      }
    } else if (c.op === 'update') await setApiKeyLimits(tx, nsId, c.id, c.desired.limits);
    else {
      if (c.op === 'delete' || c.op === 'replace') await revokeApiKey(tx, nsId, c.id);
      if (c.op !== 'delete') await issue(c.ns, c.desired);
    }
  }
  // Once everything is in place: rules the file does not name may still fall back to (or from) an edited backend.
  for (const e of edited) {
    const broken = await chainBrokenByEdit(tx, e.nsId, { id: e.id, ...e.member });
    if (broken !== null) throw new ConfigError(`namespace ${e.ns}: ${broken} Nothing was changed.`);
  }
  return issued;
}

function refused(message: string) {
  return (err: unknown): never => {
    if (isForeignKeyViolation(err)) throw new ConfigError(`${message}; nothing was changed.`);
    throw err;
  };
}

export type ApplyOptions = { prune: boolean; dryRun: boolean; credentialPassthrough: boolean; env?: NodeJS.ProcessEnv };

export async function applyCommand(db: OpenDatabase, args: string[], opts: ApplyOptions, out: (line: string) => void): Promise<void> {
  if (args.length !== 1) throw new ConfigError(USAGE);
  const file = path.resolve(args[0]!);
  const cfg = readApplyFile(file);
  const pool = createPool(db.conn, { max: 2, name: 'sarsen-cli' });
  try {
    await migrate(db.conn, pool);
    const tenancy = await findTenancyBySlug(pool, cfg.tenancy);
    if (tenancy === null) throw new ConfigError(`${file}: tenancy: no tenancy ${JSON.stringify(cfg.tenancy)}; create it first with sarsen tenancy create ${cfg.tenancy} --owner EMAIL.`);
    const settings = await loadSettings(pool);
    const keyring = createKeyring([{ version: 1, secret: db.secrets.credentialKey }]);
    const desired = await desiredState(cfg, {
      baseDir: path.dirname(file),
      env: opts.env ?? process.env,
      publicOnly: settings.backends_public_only === true,
      passthrough: opts.credentialPassthrough,
    }).catch((err: unknown) => {
      if (err instanceof ConfigError) fail(file, [err.message]);
      throw err;
    });
    const plan = planApply(desired, await currentState(pool, tenancy.id, keyring), opts.prune);
    out(`tenancy ${tenancy.slug}: ${plan.changes.length} change${plan.changes.length === 1 ? '' : 's'}, ${plan.unchanged} unchanged${opts.dryRun ? ' (dry run: nothing is changed)' : ''}`);
    for (const c of plan.changes) out(describeChange(c));
    if (opts.dryRun || plan.changes.length === 0) return;
    const issued = await withTransaction(pool, (tx) => execute(tx, tenancy.id, plan.changes, keyring, db.secrets.apiKeyHashKey));
    out('applied');
    // Printed once, here: only an HMAC of each secret is stored.
    for (const k of issued) out(`key ${k.ns}/${k.name}: ${k.key}`);
  } finally {
    await pool.end();
  }
}
