// /{tenancy}/v1/namespaces/{ns}/backends (viewers read, admins write). The credential is
// write-only: sealed under credential-key bound to the backend id, never answered, never
// logged; answers say `has_credential` instead.
import net from 'node:net';
import { z } from 'zod';
import type { Router } from 'express';
import type { Deps } from '../../deps.ts';
import { ServiceError } from '../../core/errors.ts';
import { newId } from '../../core/ids.ts';
import { seal } from '../../core/sealing.ts';
import { checkHostAllowed } from '../../core/address-policy.ts';
import { withTransaction } from '../../db/pool.ts';
import {
  insertBackend,
  findBackend,
  lockBackend,
  listBackends,
  updateBackend,
  deleteBackend,
  type BackendRow,
} from '../../db/backends.ts';
import { rulesUsingBackend, type RuleRow } from '../../db/routing-rules.ts';
import { isUniqueViolation, isForeignKeyViolation } from '../../db/pg-errors.ts';
import { BACKEND_KINDS, dialectOfKind, normaliseBackendAddress } from '../../control/backends.ts';
import { routingChanged } from '../../control/resolve-model.ts';
import { chainBrokenByEdit } from '../../control/fallback-chains.ts';
import { consoleAuth } from './console-auth.ts';
import { namespaceParam, namespaceOf } from './namespaces.ts';
import { readPayload, text, isoTime } from './validate.ts';

const credential = z
  .string()
  .min(1, 'must not be empty')
  .max(8192, 'must be at most 8192 characters')
  // It travels in a header: a control character would end it or be refused upstream.
  .refine((s) => !/[\u0000-\u001f\u007f]/.test(s), 'must not contain control characters');

export const createSchema = z.strictObject({
  name: text(100),
  kind: z.enum(BACKEND_KINDS),
  address: z.string().max(2048),
  credential: credential.optional(),
  credential_source: z.enum(['stored', 'caller']).optional(),
});

export const patchSchema = z.strictObject({
  name: text(100).optional(),
  kind: z.enum(BACKEND_KINDS).optional(),
  address: z.string().max(2048).optional(),
  credential: credential.nullable().optional(),
  credential_source: z.enum(['stored', 'caller']).optional(),
});

export function backendView(b: BackendRow) {
  return {
    backend_id: b.id,
    name: b.name,
    kind: b.kind,
    dialect: b.dialect,
    address: b.address,
    credential_source: b.credential_source,
    has_credential: b.has_credential,
    created_at: isoTime(b.created_at),
  };
}

const article = (word: string) => (/^[aeiou]/i.test(word) ? 'an' : 'a');

/** Which address class a refusal names, without the addresses a name resolved to. */
function refusalMessage(hostname: string, reason: string): string {
  const literal = net.isIP(hostname.replace(/^\[|\]$/g, '')) !== 0;
  const cls = /is an? ([^:]+?) (?:address|name)$/.exec(reason)?.[1];
  const tail = 'this deployment reaches only public addresses.';
  if (cls === undefined) return `The backend host ${hostname} could not be checked (it does not resolve); ${tail}`;
  return `The backend host ${hostname} ${literal ? 'is' : 'resolves to'} ${article(cls)} ${cls} address; ${tail}`;
}

/** 400 for a malformed address, 422 for one the address policy refuses. */
async function checkedAddress(deps: Deps, input: string): Promise<string> {
  const verdict = normaliseBackendAddress(input);
  if (!verdict.ok) throw new ServiceError('bad_request', `address: ${verdict.reason}`);
  if (deps.settings.current().backends_public_only) {
    const host = await checkHostAllowed(verdict.hostname);
    if (!host.ok) throw new ServiceError('backend_host_refused', refusalMessage(verdict.hostname, host.reason));
  }
  return verdict.address;
}

function requirePassthrough(deps: Deps): void {
  if (!deps.serve.credentialPassthrough) {
    throw new ServiceError(
      'passthrough_disabled',
      'Caller-credential backends need a deployment started with --credential-passthrough.',
    );
  }
}

const duplicate = (name: string) => new ServiceError('conflict', `A backend named ${JSON.stringify(name)} already exists in this namespace.`);
const missing = () => new ServiceError('not_found', 'No such backend in this namespace.');

export function backendRoutes(deps: Deps, router: Router): void {
  const base = '/:tenancy/v1/namespaces/:ns/backends';
  const one = `${base}/:backend_id`;

  router.get(base, consoleAuth(deps, 'viewer'), namespaceParam(deps), async (_req, res) => {
    res.json({ data: (await listBackends(deps.pool, namespaceOf(res).id)).map(backendView) });
  });

  router.post(base, consoleAuth(deps, 'admin'), namespaceParam(deps), async (req, res) => {
    const body = await readPayload(req, createSchema);
    const source = body.credential_source ?? 'stored';
    if (source === 'caller') {
      if (body.credential !== undefined) {
        throw new ServiceError('bad_request', 'credential: a caller-credential backend holds no credential of its own');
      }
      requirePassthrough(deps);
    }
    const address = await checkedAddress(deps, body.address);
    const ns = namespaceOf(res);
    const id = newId('bk');
    try {
      const b = await insertBackend(deps.pool, {
        id,
        namespace_id: ns.id,
        name: body.name,
        kind: body.kind,
        dialect: dialectOfKind(body.kind),
        address,
        credential_sealed: body.credential === undefined ? null : seal(deps.keyring, body.credential, id),
        credential_source: source,
      });
      routingChanged(deps, ns.id);
      res.status(201).json(backendView(b));
    } catch (err) {
      if (isUniqueViolation(err)) throw duplicate(body.name);
      throw err;
    }
  });

  router.get(one, consoleAuth(deps, 'viewer'), namespaceParam(deps), async (req, res) => {
    const b = await findBackend(deps.pool, namespaceOf(res).id, String(req.params.backend_id));
    if (b === null) throw missing();
    res.json(backendView(b));
  });

  router.patch(one, consoleAuth(deps, 'admin'), namespaceParam(deps), async (req, res) => {
    const patch = await readPayload(req, patchSchema);
    if (patch.credential_source === 'caller') {
      if (typeof patch.credential === 'string') {
        throw new ServiceError('bad_request', 'credential: a caller-credential backend holds no credential of its own');
      }
      requirePassthrough(deps);
    }
    // The policy may resolve a name: done before the row is locked.
    const address = patch.address === undefined ? undefined : await checkedAddress(deps, patch.address);
    const ns = namespaceOf(res);
    const id = String(req.params.backend_id);
    try {
      const b = await withTransaction(deps.pool, async (tx) => {
        const cur = await lockBackend(tx, ns.id, id);
        if (cur === null) throw missing();
        const source = patch.credential_source ?? cur.credential_source;
        if (source === 'caller' && typeof patch.credential === 'string') {
          throw new ServiceError('bad_request', 'credential: a caller-credential backend holds no credential of its own');
        }
        const kind = patch.kind ?? cur.kind;
        if (dialectOfKind(kind) !== cur.dialect || source !== cur.credential_source) {
          const broken = await chainBrokenByEdit(tx, ns.id, { id, dialect: dialectOfKind(kind), credential_source: source });
          if (broken !== null) throw new ServiceError('unprocessable_entity', broken);
        }
        let sealed: Buffer | null | undefined;
        if (source === 'caller') sealed = null; // becoming a caller backend drops any stored key
        else if (typeof patch.credential === 'string') sealed = seal(deps.keyring, patch.credential, id);
        else if (patch.credential === null) sealed = null;
        return updateBackend(tx, ns.id, id, {
          name: patch.name ?? cur.name,
          kind,
          dialect: dialectOfKind(kind),
          address: address ?? cur.address,
          credential_source: source,
          credential_sealed: sealed,
        });
      });
      if (b === null) throw missing();
      routingChanged(deps, ns.id);
      res.json(backendView(b));
    } catch (err) {
      if (isUniqueViolation(err)) throw duplicate(patch.name ?? '');
      throw err;
    }
  });

  router.delete(one, consoleAuth(deps, 'admin'), namespaceParam(deps), async (req, res) => {
    const ns = namespaceOf(res);
    const id = String(req.params.backend_id);
    try {
      await withTransaction(deps.pool, async (tx) => {
        if ((await lockBackend(tx, ns.id, id)) === null) throw missing();
        const users = await rulesUsingBackend(tx, id);
        if (users.length > 0) throw rulesInTheWay(id, users);
        await deleteBackend(tx, ns.id, id);
      });
    } catch (err) {
      // A rule added meanwhile: the foreign key catches what the count could not.
      if (isForeignKeyViolation(err)) throw rulesInTheWay(id, []);
      throw err;
    }
    routingChanged(deps, ns.id);
    res.status(204).end();
  });
}

/** 409 naming the rules that route to the backend or fall back to it. */
function rulesInTheWay(id: string, rules: RuleRow[]): ServiceError {
  if (rules.length === 0) return new ServiceError('conflict', 'A routing rule uses this backend; delete or repoint it first.');
  const named = rules.map((r) => `${JSON.stringify(r.model)} (${r.id}, ${r.backend_id === id ? 'its backend' : 'a fallback'})`);
  const one = rules.length === 1;
  return new ServiceError('conflict', `This backend is used by routing rule${one ? '' : 's'} ${named.join(', ')}; delete or repoint ${one ? 'it' : 'them'} first.`);
}
