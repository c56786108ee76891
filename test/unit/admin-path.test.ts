// The administration router lets through only paths ADMIN_PATH admits (src/http/admin/index.ts):
// every one of its routes must be among them, and no service route may be.
import { expect } from 'chai';
import type { Router } from 'express';
import { ADMIN_PATH, adminRouter } from '../../src/http/admin/index.ts';
import type { Deps } from '../../src/deps.ts';

// What building the routes reads; none of them is called here.
const deps = { secrets: { apiKeyHashKey: Buffer.alloc(32) }, settings: { current: () => ({}) } } as unknown as Deps;

const routePaths = (router: Router): string[] => router.stack.flatMap((layer) => (layer.route ? [String(layer.route.path)] : []));
// A path the pattern matches: each parameter given a value (a namespace that is not itself "v1").
const concrete = (pattern: string): string => pattern.replace(/:(\w+)/g, (_, name: string) => `some-${name}`);

describe('the administration routes’ gate', () => {
  it('admits every administration route, in any case, with or without a trailing slash', () => {
    const paths = routePaths(adminRouter(deps));
    expect(paths.length).to.be.greaterThan(30);
    for (const path of paths.map(concrete)) {
      for (const variant of [path, `${path}/`, path.toUpperCase()]) expect(ADMIN_PATH.test(variant), variant).to.equal(true);
    }
  });

  it('turns away the service routes, under /{tenancy}/{namespace}/v1', () => {
    for (const route of ['chat/completions', 'messages', 'responses', 'requests', 'requests/req_1', 'usage', 'files', 'batches', 'messages/batches']) {
      const path = `/some-tenancy/some-namespace/v1/${route}`;
      expect(ADMIN_PATH.test(path), path).to.equal(false);
    }
  });
});
