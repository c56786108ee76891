// Every router the API role serves, in mount order. The executor role serves health only.
import type { Router } from 'express';
import type { Deps } from '../deps.ts';
import { adminRouter } from './admin/index.ts';
import { serviceRouter } from './service/routes.ts';
import { consoleRouter } from './console/index.ts';
import { closeServiceAuth } from './service-auth.ts';
import { closeRouting } from '../control/resolve-model.ts';

export type ApiRouters = { routers: Router[]; close(): Promise<void> };

export function apiRouters(deps: Deps): ApiRouters {
  return {
    routers: [consoleRouter(), adminRouter(deps), serviceRouter(deps)],
    // After the listener has drained: write pending API key last-used times, drop caches.
    close: async () => {
      await closeServiceAuth(deps);
      closeRouting(deps);
    },
  };
}
