// Every router the API role serves, in mount order. The executor role serves health only.
// The service routes come first: a router a request leaves without an answer hands it on
// through setImmediate (express's router), so a service call mounted behind the console and
// administration routers waited two turns of the event loop before its handler ran. No
// administration or console path matches a service route (/{tenancy}/{namespace}/v1/...).
import type { Router } from 'express';
import type { Deps } from '../deps.ts';
import { adminRouter } from './admin/index.ts';
import { serviceRouter } from './service/routes.ts';
import { consoleRouter } from './console/index.ts';
import { closeServiceAuth } from './service-auth.ts';

export type ApiRouters = { routers: Router[]; close(): Promise<void> };

export function apiRouters(deps: Deps): ApiRouters {
  return {
    routers: [serviceRouter(deps), adminRouter(deps), consoleRouter()],
    // After the listener has drained: write pending API key last-used times, drop the key cache
    // (the routing cache is the process's: server.ts drops it).
    close: async () => {
      await closeServiceAuth(deps);
    },
  };
}
